"""The AgentPool definitions the app writes against are the SDK's, derived again on every run.

shared/kernel/definitions/containerservice-<api-version>.json are derived from the generated models of the
Azure SDK release of each api-version (requirements.txt for the stable one, requirements-sdk-preview.txt for
the preview one; both generated from Azure/azure-rest-api-specs). A new SDK with a new property, a new enum
value or a property turned read-only changes the derivation, and these tests fail until the files are
derived again (``make aks-definitions``), which in turn makes the clone table's own test name the property.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shared.kernel import definitions

ROOT = Path(__file__).resolve().parents[2]
PREVIEW_SDK = ROOT / ".tools" / "sdk" / "containerservice-preview"


def derived(sdk_path: Path | None) -> dict:
    env = dict(os.environ)
    if sdk_path is not None:
        env["PYTHONPATH"] = str(sdk_path)
    out = subprocess.run([sys.executable, "-m", "shared.kernel.definitions.derive", "--stdout"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def committed(api_version: str) -> dict:
    return json.loads((definitions.HERE / f"containerservice-{api_version}.json").read_text())


def pinned(requirements: str) -> str:
    text = (ROOT / requirements).read_text()
    match = re.search(r"^azure-mgmt-containerservice==(\S+)$", text, re.MULTILINE)
    assert match, f"{requirements} pins no azure-mgmt-containerservice"
    return match.group(1)


def test_the_stable_definition_is_what_the_installed_sdk_says() -> None:
    data = derived(None)
    assert data["apiVersion"] == definitions.STABLE_API_VERSION, "the installed SDK speaks another api-version"
    assert data == committed(definitions.STABLE_API_VERSION), "stale: run make aks-definitions"
    assert f"=={pinned('requirements.txt')} " in data["derivedFrom"]


def test_the_preview_definition_is_what_the_preview_sdk_release_says() -> None:
    assert PREVIEW_SDK.is_dir(), f"{PREVIEW_SDK} is missing: make venv installs it (requirements-sdk-preview.txt)"
    data = derived(PREVIEW_SDK)
    assert data["apiVersion"] == definitions.PREVIEW_API_VERSION, "requirements-sdk-preview.txt pins another api-version"
    assert data == committed(definitions.PREVIEW_API_VERSION), "stale: run make aks-definitions"
    assert f"=={pinned('requirements-sdk-preview.txt')} " in data["derivedFrom"]


def test_the_preview_version_carries_what_the_issue_found_lost_on_the_stable_one() -> None:
    stable, preview = (dict(definitions.definitions(v).paths()) for v in definitions.API_VERSIONS)
    lost = ["kubeletConfig.kubeReserved", "kubeletConfig.hardEvictionThreshold", "kubeletConfig.softEvictionThreshold",
            "kubeletConfig.softEvictionGracePeriod", "kubeletConfig.evictionMaxPodGracePeriodInSeconds",
            "kubeletConfig.seccompDefault", "nodeInitializationTaints", "preparedImageSpecificationProfile"]
    assert [p for p in lost if p in preview] == lost
    assert [p for p in lost if p in stable] == []


@pytest.mark.parametrize(("props", "version"), [
    ({"vmSize": "Standard_NC4as_T4_v3", "count": 1}, definitions.STABLE_API_VERSION),
    ({"gpuProfile": {"nvidia": {"managementMode": "Managed"}}}, definitions.STABLE_API_VERSION),
    ({"gpuProfile": {"nvidia": {"migStrategy": "Single"}}}, definitions.PREVIEW_API_VERSION),
    ({"kubeletConfig": {"cpuManagerPolicy": "static", "kubeReserved": {"cpuMillicores": 100}}},
     definitions.PREVIEW_API_VERSION),
    ({"networkProfile": {"secondaryNetworkInterfaces": [{"vnetSubnetId": "x"}]}}, definitions.PREVIEW_API_VERSION),
    ({"kubeletConfig": {"aPropertyOfTomorrow": 1}}, None),
    ({"count": None, "kubeletConfig": {"kubeReserved": None}}, definitions.STABLE_API_VERSION),
], ids=["plain", "managed GPU", "managed MIG", "kubeReserved", "secondary NICs", "unknown everywhere", "nulls are absent"])
def test_the_api_version_follows_the_data(props: dict, version: str | None) -> None:
    assert definitions.api_version_for(props) == version


def test_what_no_version_carries_is_named_at_its_own_depth() -> None:
    props = {"vmSize": "x", "kubeletConfig": {"kubeReserved": {"cpuMillicores": 1}, "aPropertyOfTomorrow": 1},
             "tomorrow": {"a": 1}}
    assert definitions.unrepresentable(props) == ["kubeletConfig.aPropertyOfTomorrow", "tomorrow"]


@pytest.mark.parametrize(("body", "problem"), [
    ({"vmSize": 4}, "vmSize: expected a string"),
    ({"count": "3"}, "count: expected an integer"),
    ({"enableFIPS": "true"}, "enableFIPS: expected a boolean"),
    ({"osType": "Plan9"}, "osType: 'Plan9' is not one of Linux, Windows"),
    ({"eTag": "x"}, "eTag: read-only"),
    ({"localDNSProfile": {"mode": "Preferred", "state": "Enabled"}}, "localDNSProfile.state: read-only"),
    ({"nodeTaints": "a=b:NoSchedule"}, "nodeTaints: expected an array"),
    ({"tags": {"a": 1}}, "tags{a}: expected a string"),
    ({"kubeletConfig": {"kubeReserved": {"cpuMillicores": 1}}}, "kubeletConfig.kubeReserved: not a property"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_body_is_judged_by_the_stable_definition(body: dict, problem: str) -> None:
    found = definitions.definitions(definitions.STABLE_API_VERSION).problems(body)
    assert any(p.startswith(problem) for p in found), found


def test_a_required_property_of_a_request_body_must_be_present() -> None:
    defs = definitions.definitions(definitions.STABLE_API_VERSION)
    assert defs.problems({}, "AgentPoolDeleteMachinesParameter") == ["machineNames: required"]
    assert defs.problems({"machineNames": ["a"]}, "AgentPoolDeleteMachinesParameter") == []


def test_what_a_server_shows_on_a_version_is_what_its_definition_has() -> None:
    stored = {"count": 2, "kubeletConfig": {"cpuManagerPolicy": "static", "kubeReserved": {"cpuMillicores": 1}},
              "nodeInitializationTaints": ["a=b:NoSchedule"]}
    stable = definitions.definitions(definitions.STABLE_API_VERSION)
    assert stable.keep_known(stored) == {"count": 2, "kubeletConfig": {"cpuManagerPolicy": "static"}}
    assert definitions.definitions(definitions.PREVIEW_API_VERSION).keep_known(stored) == stored
