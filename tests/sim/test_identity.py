"""The App Service managed-identity endpoint: the secret header, the protocol's errors, tokens per audience."""

from __future__ import annotations

import json
import time

import pytest

from sim.core.http import Headers, Request, Response
from sim.identity.api import IdentityApi
from sim.identity.tokens import AKS_AUDIENCES, ARM_AUDIENCES, EVENTGRID_AUDIENCES, STORAGE_AUDIENCES
from sim.model import Fleet, SimClock

CLIENT_ID = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def fleet() -> Fleet:
    f = Fleet(seed=1, clock=SimClock(manual=True))
    f.identity_header = "s3cret"
    return f


def ask(api: IdentityApi, query: str, *, secret: str | None = "s3cret", method: str = "GET",
        path: str = "/msi/token") -> Response:
    headers = Headers({"X-IDENTITY-HEADER": secret} if secret is not None else {})
    return api.handle(Request(method, f"{path}?{query}", headers))


@pytest.mark.parametrize(("resource", "audiences"), [
    pytest.param("https://management.azure.com/", ARM_AUDIENCES, id="arm"),
    pytest.param("6dae42f8-4368-4678-94ff-3960e28e3630", AKS_AUDIENCES, id="aks-server-app"),
    pytest.param("https://eventgrid.azure.net", EVENTGRID_AUDIENCES, id="eventgrid"),
    pytest.param("https://storage.azure.com/", STORAGE_AUDIENCES, id="storage"),
])
def test_a_token_is_issued_for_each_audience_the_app_needs(fleet: Fleet, resource: str, audiences: tuple[str, ...]) -> None:
    resp = ask(IdentityApi(fleet), f"resource={resource}&api-version=2019-08-01&client_id={CLIENT_ID}")
    payload = json.loads(resp.body)
    assert resp.status == 200
    assert (payload["token_type"], payload["resource"], payload["client_id"]) == ("Bearer", resource, CLIENT_ID)
    assert fleet.tokens.verify(payload["access_token"], audiences).status == 200
    other = fleet.tokens.verify(payload["access_token"], ("https://vault.azure.net",))
    assert (other.status, other.wrong_audience) == (401, True)  # another audience fails authentication (issue 11)


def test_the_token_names_the_apps_object_id_and_client_id(fleet: Fleet) -> None:
    from sim.identity import APP_PRINCIPAL_ID

    resp = ask(IdentityApi(fleet), f"resource=https://management.azure.com/&api-version=2019-08-01&client_id={CLIENT_ID}")
    verdict = fleet.tokens.verify(json.loads(resp.body)["access_token"], ARM_AUDIENCES)
    assert (verdict.principal, verdict.client_id, verdict.groups, verdict.admin) == (APP_PRINCIPAL_ID, CLIENT_ID, (), False)


def test_expires_on_is_wall_clock_seconds_scaled_by_the_clock_speed() -> None:
    fast = Fleet(seed=1, clock=SimClock(speed=60.0))
    fast.identity_header = "s3cret"
    payload = json.loads(ask(IdentityApi(fast), "resource=https://management.azure.com/&api-version=2019-08-01").body)
    lifetime_real = int(payload["expires_on"]) - time.time()
    assert abs(lifetime_real - fast.tokens.lifetime_s / 60.0) < 5


@pytest.mark.parametrize(("query", "secret", "status"), [
    pytest.param("resource=https://management.azure.com/&api-version=2019-08-01", None, 401, id="no-secret"),
    pytest.param("resource=https://management.azure.com/&api-version=2019-08-01", "guess", 401, id="wrong-secret"),
    pytest.param("api-version=2019-08-01", "s3cret", 400, id="no-resource"),
    pytest.param("resource=https://management.azure.com/&api-version=2017-09-01", "s3cret", 400, id="old-api-version"),
    pytest.param("resource=https://management.azure.com/", "s3cret", 400, id="no-api-version"),
])
def test_requests_outside_the_protocol_are_refused_as_app_service_does(fleet: Fleet, query: str, secret: str | None,
                                                                       status: int) -> None:
    resp = ask(IdentityApi(fleet), query, secret=secret)
    assert resp.status == status
    assert json.loads(resp.body)["statusCode"] == status


def test_an_identity_that_is_not_assigned_is_refused_when_the_fleet_lists_its_identities(fleet: Fleet) -> None:
    fleet.identity_client_ids = [CLIENT_ID]
    other = "99999999-2222-3333-4444-555555555555"
    resp = ask(IdentityApi(fleet), f"resource=https://management.azure.com/&api-version=2019-08-01&client_id={other}")
    assert resp.status == 400


def test_the_secret_is_generated_when_the_fleet_has_none() -> None:
    fleet = Fleet(seed=1, clock=SimClock(manual=True))
    api = IdentityApi(fleet)
    assert fleet.identity_header and api.secret == fleet.identity_header


def test_a_post_or_an_unknown_path_is_refused(fleet: Fleet) -> None:
    api = IdentityApi(fleet)
    assert ask(api, "resource=x&api-version=2019-08-01", method="POST").status == 405
    assert ask(api, "resource=x&api-version=2019-08-01", path="/metadata/identity/oauth2/token").status == 404


def test_an_identity_fault_answers_instead_of_the_endpoint(fleet: Fleet) -> None:
    fleet.faults.add({"target": "identity", "status": 500, "count": 1})
    api = IdentityApi(fleet)
    assert ask(api, "resource=https://management.azure.com/&api-version=2019-08-01").status == 500
    assert ask(api, "resource=https://management.azure.com/&api-version=2019-08-01").status == 200
