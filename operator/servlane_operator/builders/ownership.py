"""Whether an object named like one of an AIModel's children is that model's to change or delete.

The operator applies `model-<name>` with force and deletes it when no longer wanted. An object of that
name that someone else made (another controller's Deployment, a hand-made Service, an HPA of a Helm
release) must be left alone: taking it over would change it, add this AIModel as its controller (so
deleting the AIModel would garbage-collect it) or delete it. Only a controller ownerReference with this
AIModel's uid makes it ours; a name, labels or a reference to a deleted AIModel of the same name do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Ownership(Enum):
    ABSENT = "absent"
    OWNED = "owned"
    FOREIGN = "foreign"


def ownership(live: Mapping[str, Any] | None, model_uid: str) -> Ownership:
    """ABSENT when there is no such object, OWNED when this AIModel (by uid) is its controller, else FOREIGN."""
    if live is None:
        return Ownership.ABSENT
    references = (live.get("metadata") or {}).get("ownerReferences") or []
    controlled = any(ref.get("controller") is True and ref.get("uid") == model_uid for ref in references)
    return Ownership.OWNED if controlled and model_uid else Ownership.FOREIGN


def conflict_message(kind: str, name: str) -> str:
    return (
        f"{kind} {name} exists and is not owned by this AIModel: delete or rename it, then the operator creates its own"
    )


@dataclass(frozen=True)
class ChildActions:
    apply: list[dict[str, Any]]
    # (apiVersion, kind, uid) of owned children to delete; the uid is a precondition of the delete.
    delete: list[tuple[str, str, str]]
    # One message per child left alone because someone else's object holds its name.
    conflicts: list[str]


def child_actions(
    apply: Sequence[dict[str, Any]],
    delete: Sequence[tuple[str, str]],
    live: Mapping[str, Mapping[str, Any] | None],
    model_uid: str,
) -> ChildActions:
    """What to apply and delete of a ChildPlan, given each child's live object by kind (None: absent).
    A kind missing from `live` was not read (known absent): nothing to delete."""
    to_apply: list[dict[str, Any]] = []
    to_delete: list[tuple[str, str, str]] = []
    conflicts: list[str] = []
    for obj in apply:
        found = live.get(obj["kind"])
        if ownership(found, model_uid) is Ownership.FOREIGN:
            conflicts.append(conflict_message(obj["kind"], obj["metadata"]["name"]))
        else:
            to_apply.append(obj)
    for api_version, kind in delete:
        found = live.get(kind)
        match ownership(found, model_uid):
            case Ownership.OWNED:
                assert found is not None
                to_delete.append((api_version, kind, str(found["metadata"]["uid"])))
            case Ownership.FOREIGN:
                assert found is not None
                conflicts.append(conflict_message(kind, str(found["metadata"].get("name", ""))))
            case Ownership.ABSENT:
                pass
    return ChildActions(apply=to_apply, delete=to_delete, conflicts=conflicts)
