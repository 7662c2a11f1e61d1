"""A batch's plain model names resolve as its owner's own requests do: a scoped key's in its own namespaces,
so another team's same-named feature (in the first serving namespace) neither answers the lines nor
shares their concurrency slot and metrics. While the keys file does not parse, batch lines wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servlane_gateway.batch import metrics as m
from tests.support.batch import finished, jsonl_of, request_line, submit
from tests.support.gateway_harness import StartGateway, Upstream, aifeature, aimodel
from tests.support.polling import wait_until

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


def test_batch_lines_wait_while_the_keys_file_does_not_parse_and_run_once_it_does(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    """A keys file that stops parsing refuses every request (fail closed), but a typo must not fail the
    queued lines of a batch for good: they wait, and run once the file parses again."""
    keys = f"team-b: {TEAM_B_KEY} team-b/*\n"
    gw = start_gateway(
        two_teams(upstreams),
        keys=keys,
        batch_database_url=f"sqlite:///{tmp_path / 'batch.db'}",
        batch_poll_seconds=0.05,
        batch_concurrency_per_feature=1,  # the second line waits for the slow first one's slot
    )
    client = gw.client(TEAM_B_KEY)
    seen = len(upstreams["v2"].state.bodies)
    batch = submit(client, [request_line("slow", "delay=1"), request_line("next")])
    wait_until("the slow line to reach team-b's model", lambda: len(upstreams["v2"].state.bodies) > seen, 10)
    keys_file = tmp_path / "keys"
    replacement = keys_file.with_suffix(".new")
    replacement.write_text(f"team-b {TEAM_B_KEY}\n")  # a colon lost
    replacement.replace(keys_file)
    wait_until("the broken keys file to apply", lambda: gw.state.keys.broken, 10)

    def slow_line_answered() -> bool:
        return gw.sample(m.REQUESTS, namespace="team-b", feature="chat", outcome=m.SUCCEEDED) == 1

    wait_until("the slow line to be answered, freeing the slot", slow_line_answered, 10)
    assert gw.sample(m.REQUESTS, namespace="team-b", feature="chat", outcome=m.FAILED) == 0
    replacement.write_text(keys)
    replacement.replace(keys_file)
    wait_until("the fixed keys file to apply", lambda: not gw.state.keys.broken, 10)
    done = finished(client, batch.id)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 0), done
