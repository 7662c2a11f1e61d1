"""A batch's plain model names resolve as its owner's own requests do: a scoped key's in its own namespaces,
so another team's same-named feature (in the first serving namespace) neither answers the lines nor
shares their concurrency slot and metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servlane_gateway.batch import metrics as m
from tests.gateway.gateway_harness import StartGateway, Upstream, aifeature, aimodel
from tests.gateway.test_gateway_batch_api import finished, jsonl_of, request_line, submit

TEAM_B_KEY = "sk-team-b-0123456789abcdef0123456789"


def two_teams(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    """`chat` in team-a (answered by v1) and in team-b (v2)."""
    team_a_model = aimodel("m", upstreams["v1"].url)
    team_a_model["metadata"]["namespace"] = "team-a"
    team_b_model = aimodel("m", upstreams["v2"].url)
    team_b_model["metadata"]["namespace"] = "team-b"
    features = [aifeature("chat", [("m", 100)], namespace=ns) for ns in ("team-a", "team-b")]
    return [team_a_model, team_b_model, *features]


def test_a_scoped_keys_batch_lines_go_to_its_own_namespaces_feature(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = start_gateway(
        two_teams(upstreams),
        keys=f"team-b: {TEAM_B_KEY} team-b/*\n",
        serving_namespaces=["team-a"],
        batch_database_url=f"sqlite:///{tmp_path / 'batch.db'}",
        batch_poll_seconds=0.05,
    )
    client = gw.client(TEAM_B_KEY)
    team_a_before = len(upstreams["v1"].state.bodies)
    done = finished(client, submit(client, [request_line("a"), request_line("b")]).id)
    assert done.status == "completed", done
    output = jsonl_of(client, done.output_file_id)
    assert [o["response"]["body"]["choices"][0]["message"]["content"] for o in output] == ["v2", "v2"]
    assert len(upstreams["v1"].state.bodies) == team_a_before  # team-a's model saw nothing of team-b's
    assert gw.sample(m.REQUESTS, namespace="team-b", feature="chat", outcome=m.SUCCEEDED) == 2
    assert gw.sample(m.REQUESTS, namespace="team-a", feature="chat", outcome=m.SUCCEEDED) == 0
