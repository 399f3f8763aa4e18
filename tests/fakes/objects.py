"""Arbitrary Kubernetes objects (Jobs, Karpenter NodePools and NodeClaims...) as the API server stores them.

Split out of tests/fakes/kube.py: the generic object verbs of KubePort (create, apply, get, delete) keep
their own store, keyed by (apiVersion, kind, namespace, name), with the server's uid and its preconditions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.kernel.errors import Conflict, NotFound

Key = tuple[str, str, str, str]


def copied(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy through JSON, as a round trip to the API server makes one."""
    return json.loads(json.dumps(obj))  # type: ignore[no-any-return]


def key_of(api_version: str, kind: str, name: str, namespace: str | None) -> Key:
    return (api_version, kind, namespace or "", name)


class ObjectStore:
    """``objects`` as stored; ``created`` / ``applied`` / ``deleted`` record each write in order."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[Key] = []
        self.uids = 0

    def _new_uid(self) -> str:
        self.uids += 1
        return f"00000000-0000-4000-8000-{self.uids:012d}"

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> Key:
        meta = obj["metadata"]
        return key_of(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

    def store_new(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """As the API server's create: 409 when the name is taken; else stored with a fresh uid, and returned."""
        key = self._key(obj)
        if key in self.objects:
            raise Conflict(f"{obj['kind']} {obj['metadata']['name']} exists")
        stored = copied(obj)
        stored["metadata"]["uid"] = self._new_uid()
        self.objects[key] = stored
        self.created.append(stored)
        return copied(stored)

    def store_applied(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """As a server-side apply: a new object gets a fresh uid, an existing one keeps its own."""
        key = self._key(obj)
        stored = copied(obj)
        previous = (self.objects.get(key) or {}).get("metadata") or {}
        stored["metadata"]["uid"] = previous.get("uid") or self._new_uid()
        self.objects[key] = stored
        self.applied.append(copied(obj))
        return obj

    def stored(self, api_version: str, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
        obj = self.objects.get(key_of(api_version, kind, name, namespace))
        return None if obj is None else copied(obj)

    def remove(self, api_version: str, kind: str, name: str, namespace: str | None, *, uid: str | None = None) -> None:
        """As a delete: 404 when absent, 409 when a ``uid`` precondition names another object."""
        key = key_of(api_version, kind, name, namespace)
        if key not in self.objects:
            raise NotFound(f"{kind} {name}")
        if uid and (self.objects[key].get("metadata") or {}).get("uid") != uid:
            raise Conflict(f"{kind} {name}: Precondition failed: UID in precondition: {uid}")
        del self.objects[key]
        self.deleted.append(key)

    def put_foreign_job(self, job: Mapping[str, Any], *, uid: str = "f0f0f0f0-0000-4000-8000-000000000000") -> None:
        """A Job someone else created (another identity with rights in the namespace), stored as is."""
        stored = copied(job)
        stored["metadata"]["uid"] = uid
        self.objects[self._key(stored)] = stored

    def set_job_status(self, name: str, namespace: str, status: Mapping[str, Any]) -> None:
        self.objects[key_of("batch/v1", "Job", name, namespace)]["status"] = dict(status)

    def jobs(self) -> list[dict[str, Any]]:
        return [o for k, o in self.objects.items() if k[1] == "Job"]
