"""The simulator answers a kube-apiserver token webhook (TokenReview) as AKS's Entra webhook does:
the tokens its identity endpoint issued for the AKS server application authenticate as their object id."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sim.identity import APP_PRINCIPAL_ID
from sim.testing import SimHandle, start_sim

AKS = "6dae42f8-4368-4678-94ff-3960e28e3630"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario="drain") as handle:
        yield handle


def review(sim: SimHandle, token: str) -> dict:
    return sim.control("POST", "/tokenreview", {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                                "spec": {"token": token, "audiences": ["https://kubernetes.default.svc"]}})


def test_the_apps_token_for_the_aks_server_authenticates_as_its_object_id(sim: SimHandle) -> None:
    token = sim.control("POST", "/token", {"audience": AKS, "principal": APP_PRINCIPAL_ID})["access_token"]
    status = review(sim, token)["status"]
    assert status["authenticated"] is True
    assert status["user"]["username"] == APP_PRINCIPAL_ID
    assert status["user"]["groups"] == []
    assert status["audiences"] == ["https://kubernetes.default.svc"]


def test_a_token_for_another_audience_or_a_forged_one_does_not_authenticate(sim: SimHandle) -> None:
    arm = sim.control("POST", "/token", {"audience": "https://management.azure.com/", "principal": APP_PRINCIPAL_ID})
    assert review(sim, arm["access_token"])["status"]["authenticated"] is False
    assert review(sim, "forged.token")["status"] == {"authenticated": False, "error": "token signature is invalid"}
