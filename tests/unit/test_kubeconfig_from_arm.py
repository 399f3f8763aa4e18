"""A kubeconfig from ARM is input, not configuration: it cannot switch TLS verification off.

``listClusterUserCredential`` hands the steward a kubeconfig; whoever can influence that document
(a compromised or spoofed endpoint, a proxy, a test double) must not be able to make the app send
its AKS bearer token over plain HTTP, to an unverified server, or trust a CA file on the host.
shared.adapters.kube.auth.server_and_ca refuses each of those (issue 11 §4), and the simulator's own kubeconfig
(sim/arm/api.py ``_kubeconfig``) still passes.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from shared.adapters.kube.auth import server_and_ca
from shared.kernel.errors import Invalid

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SERVER = "https://c1-dns.hcp.eastus.azmk8s.io:443"


def kubeconfig(**cluster: Any) -> bytes:
    entry = {"server": SERVER, "certificate-authority-data": base64.b64encode(PEM).decode(), **cluster}
    entry = {k: v for k, v in entry.items() if v is not None}
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c1",
           "clusters": [{"name": "c1", "cluster": entry}],
           "contexts": [{"name": "c1", "context": {"cluster": "c1", "user": "u"}}],
           "users": [{"name": "u", "user": {"exec": {"command": "kubelogin"}}}]}
    return yaml.safe_dump(doc).encode()


def test_an_aks_style_kubeconfig_gives_the_server_and_the_ca_from_its_data() -> None:
    server, ca, insecure = server_and_ca(kubeconfig())
    assert (server, ca, insecure) == (SERVER, PEM, False)


@pytest.mark.parametrize(
    ("cluster", "why"),
    [
        ({"insecure-skip-tls-verify": True}, "insecure-skip-tls-verify"),
        ({"insecure-skip-tls-verify": True, "certificate-authority-data": None}, "insecure-skip-tls-verify"),
        ({"insecure-skip-tls-verify": "true"}, "insecure-skip-tls-verify"),
        ({"server": "http://c1-dns.hcp.eastus.azmk8s.io:80"}, "https"),
        ({"server": "c1-dns.hcp.eastus.azmk8s.io:443"}, "https"),
        ({"server": "https://"}, "https"),
        ({"server": "https://user:secret@c1-dns.hcp.eastus.azmk8s.io"}, "credentials"),
        ({"certificate-authority": "/etc/ssl/private/attacker-ca.pem"}, "certificate-authority"),
        ({"certificate-authority": "/etc/ssl/ca.pem", "certificate-authority-data": None}, "certificate-authority"),
        ({"certificate-authority-data": "not base64 at all!"}, "base64"),
        ({"certificate-authority-data": base64.b64encode(b"just bytes").decode()}, "PEM"),
    ],
    ids=["skip tls verify", "skip tls verify without a ca", "skip tls verify as a string", "plain http server",
         "server without a scheme", "https without a host", "credentials in the server url", "a ca file path",
         "a ca file path instead of data", "ca data that is not base64", "ca data that is not pem"],
)
def test_a_kubeconfig_that_would_weaken_tls_is_refused(cluster: dict[str, Any], why: str) -> None:
    with pytest.raises(Invalid, match=why):
        server_and_ca(kubeconfig(**cluster))


def test_a_kubeconfig_without_ca_data_still_verifies_against_the_configured_trust() -> None:
    server, ca, insecure = server_and_ca(kubeconfig(**{"certificate-authority-data": None}))
    assert (server, ca, insecure) == (SERVER, None, False)


def test_an_explicit_false_skip_verify_is_accepted() -> None:
    assert server_and_ca(kubeconfig(**{"insecure-skip-tls-verify": False}))[2] is False


def test_a_document_that_is_not_a_kubeconfig_is_refused_with_invalid() -> None:
    with pytest.raises(Invalid):
        server_and_ca(b"- just\n- a list\n")
    with pytest.raises(Invalid):
        server_and_ca(b"clusters: [\n")


@pytest.mark.parametrize("fmt", ["exec", "azure"])
def test_the_simulators_kubeconfig_passes(fmt: str) -> None:
    from sim.arm.api import ArmApi
    from sim.core.http import Headers, Request
    from sim.model import Fleet, SimClock

    fleet = Fleet(seed=1, clock=SimClock(manual=True))
    fleet.ca_pem = PEM.decode()
    cluster = fleet.add_cluster(subscription="00000000-0000-0000-0000-00000000aaaa", resource_group="rg1", name="c1",
                                tags={})
    api = ArmApi(fleet)
    token = fleet.tokens.issue("https://management.azure.com/")[0]
    headers = Headers({"Host": "127.0.0.1:8443", "Authorization": f"Bearer {token}"})
    path = f"{cluster.id}/listClusterUserCredential?format={fmt}&api-version=2026-08-01"
    response = api.handle(Request("POST", path, headers, b""))
    assert response.status == 200, response.body
    import json

    value = json.loads(response.body)["kubeconfigs"][0]["value"]
    server, ca, insecure = server_and_ca(base64.b64decode(value))
    assert server == "https://127.0.0.1:8443/k8s/00000000-0000-0000-0000-00000000aaaa/rg1/c1"
    assert ca == PEM and insecure is False
