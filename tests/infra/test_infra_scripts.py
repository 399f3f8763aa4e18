"""The azd hook and the helper scripts hand the Bicep exactly what it asks for.

They run here against stand-ins for `az` and `azd` on PATH that record their arguments, so a
renamed parameter or output breaks this test rather than the first real `azd up`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from infra_facts import REPO, bicep

SCRIPTS = REPO / "scripts"
SH = shutil.which("sh")

pytestmark = pytest.mark.skipif(SH is None, reason="no POSIX shell")

STUB = """#!/bin/sh
printf '%s\\n' "$0 $*" >> "$CALLS"
if [ "$1 $2" = "deployment group" ] && [ -n "${FAIL_DEPLOYMENTS:-}" ]; then
  failed=$(grep -c " deployment group create " "$CALLS")
  [ "$failed" -le "$FAIL_DEPLOYMENTS" ] && exit 1
fi
case "$1 $2" in
  "aks list") cat "$AKS_LIST" ;;
  "account show") echo 00000000-0000-0000-0000-000000000001 ;;
esac
case "$*" in
  *"apply -f -") cat > "$CALLS.stdin" ;;
esac
exit 0
"""


def _stub_path(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("az", "azd", "kubectl", "kubelogin"):
        path = bin_dir / tool
        path.write_text(STUB, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    calls.write_text("", encoding="utf-8")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "CALLS": str(calls),
           "AKS_LIST": str(tmp_path / "aks.json"), "HOME": str(tmp_path)}
    return env


def _calls(env: dict[str, str]) -> list[str]:
    return Path(env["CALLS"]).read_text(encoding="utf-8").splitlines()


def _main_outputs() -> set[str]:
    return set(bicep("main.bicep")["outputs"])


def test_the_postdeploy_hook_deploys_the_subscription_with_every_parameter_it_needs(tmp_path: Path) -> None:
    env = _stub_path(tmp_path)
    outputs = {name: f"value-of-{name}" for name in _main_outputs()}
    result = subprocess.run([SH, str(SCRIPTS / "postdeploy.sh")], env={**env, **outputs}, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    [call] = [c for c in _calls(env) if " deployment group create " in f" {c.split(' ', 1)[1]} "
              and "eventgrid-subscription.bicep" in c]
    assert "--template-file" in call and call.split("--template-file ")[1].split()[0].endswith(
        "infra/app/eventgrid-subscription.bicep")
    assert f"--resource-group {outputs['AZURE_RESOURCE_GROUP']}" in call
    passed = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for arg in call.split() if "=" in arg}
    wanted = bicep("app/eventgrid-subscription.bicep")["parameters"]
    assert set(passed) == set(wanted)
    assert all(value.startswith("value-of-") for value in passed.values()), "every value comes from an azd output"


@pytest.mark.parametrize(("failures", "code", "attempts"), [(2, 0, 3), (5, 1, 3)],
                         ids=["succeeds once the function is indexed", "gives up after the last attempt"])
def test_the_postdeploy_hook_retries_while_the_function_is_not_indexed(
        tmp_path: Path, failures: int, code: int, attempts: int) -> None:
    env = _stub_path(tmp_path)
    outputs = {name: f"value-of-{name}" for name in _main_outputs()}
    result = subprocess.run([SH, str(SCRIPTS / "postdeploy.sh")], capture_output=True, text=True, timeout=30,
                            env={**env, **outputs, "FAIL_DEPLOYMENTS": str(failures), "POSTDEPLOY_ATTEMPTS": "3",
                                 "POSTDEPLOY_RETRY_DELAY_S": "0"}, check=False)
    assert result.returncode == code, result.stderr
    assert sum(" deployment group create " in c and "eventgrid-subscription.bicep" in c for c in _calls(env)) == attempts
    if code:
        assert "azd hooks run postdeploy" in result.stderr


def test_the_postdeploy_hook_subscribes_health_events_on_each_fleet_subscription(tmp_path: Path) -> None:
    env = _stub_path(tmp_path)
    outputs = {name: f"value-of-{name}" for name in _main_outputs()}
    outputs["HEALTH_FLEET_SUBSCRIPTIONS"] = "sub-a sub-b"
    result = subprocess.run([SH, str(SCRIPTS / "postdeploy.sh")], env={**env, **outputs}, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    calls = [c for c in _calls(env) if "health-events-subscription.bicep" in c]
    assert [c.split("--subscription ")[1].split()[0] for c in calls] == ["sub-a", "sub-b"]
    wanted = bicep("app/health-events-subscription.bicep")["parameters"]
    for call in calls:
        assert f"--resource-group {outputs['HEALTH_RESOURCE_GROUP']}" in call
        passed = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for arg in call.split() if "=" in arg}
        assert set(passed) == set(wanted)
        assert all(value.startswith("value-of-") for value in passed.values()), "every value comes from an azd output"


def test_the_postdeploy_hook_stops_when_provision_has_not_run(tmp_path: Path) -> None:
    env = _stub_path(tmp_path)
    result = subprocess.run([SH, str(SCRIPTS / "postdeploy.sh")], env=env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 1
    assert "run 'azd provision' first" in result.stderr
    assert not [c for c in _calls(env) if "deployment" in c]


def test_the_hooks_are_registered_in_azure_yaml() -> None:
    import yaml

    azure = yaml.safe_load((REPO / "azure.yaml").read_text(encoding="utf-8"))
    assert azure["services"]["api"] == {"project": ".", "language": "python", "host": "function"}
    assert azure["infra"]["path"] == "infra"
    hook = azure["hooks"]["postdeploy"]
    assert (REPO / hook["posix"]["run"]).resolve() == (SCRIPTS / "postdeploy.sh").resolve()
    assert (REPO / hook["windows"]["run"]).resolve() == (SCRIPTS / "postdeploy.ps1").resolve()


def test_fleet_access_saves_the_tagged_clusters_with_their_node_resource_groups(tmp_path: Path) -> None:
    env = _stub_path(tmp_path)
    clusters = [{"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1",
                 "nodeResourceGroup": "MC_rg_c1_eastus"}]
    Path(env["AKS_LIST"]).write_text(json.dumps(clusters), encoding="utf-8")
    result = subprocess.run([SH, str(SCRIPTS / "fleet-access.sh"), "team=gpu"], env=env, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    calls = _calls(env)
    [listing] = [c for c in calls if " aks list " in c]
    assert "tags.\"team\"=='gpu'" in listing and "nodeResourceGroup:nodeResourceGroup" in listing
    [saved] = [c for c in calls if " env set ACCESS_CLUSTERS " in c]
    assert json.loads(saved.split(" env set ACCESS_CLUSTERS ", 1)[1]) == clusters
    parameters = json.loads((REPO / "infra" / "main.parameters.json").read_text(encoding="utf-8"))["parameters"]
    assert parameters["accessClusters"]["value"].startswith("${ACCESS_CLUSTERS")


def test_apply_kube_rbac_binds_the_identity_by_object_id(tmp_path: Path) -> None:
    env = _stub_path(tmp_path)
    principal = "11111111-2222-3333-4444-555555555555"
    cluster = "/subscriptions/s1/resourceGroups/rg1/providers/Microsoft.ContainerService/managedClusters/c1"
    result = subprocess.run([SH, str(SCRIPTS / "apply-kube-rbac.sh"), cluster],
                            env={**env, "STEWARD_PRINCIPAL_ID": principal}, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    calls = _calls(env)
    assert any(" aks get-credentials --subscription s1 --resource-group rg1 --name c1 " in c for c in calls)
    assert any("clusterrole.yaml" in c and "namespace.yaml" in c and "role.yaml" in c and " apply " in c
               for c in calls)
    assert sum(" apply -f" in c for c in calls) == 2
    import yaml

    # the cluster-wide binding and the namespaced ones (the app's namespace, node Events in `default`), all
    # to the identity's object id (issue 11)
    bindings = list(yaml.safe_load_all(Path(env["CALLS"] + ".stdin").read_text(encoding="utf-8")))
    assert [(b["kind"], b["metadata"].get("namespace")) for b in bindings] == [
        ("ClusterRoleBinding", None), ("RoleBinding", "gpu-fleet-steward"), ("RoleBinding", "default")]
    assert [b["subjects"][0]["name"] for b in bindings] == [principal, principal, principal]


def test_apply_kube_rbac_refuses_a_principal_that_is_not_an_object_id(tmp_path: Path) -> None:
    env = _stub_path(tmp_path)
    result = subprocess.run([SH, str(SCRIPTS / "apply-kube-rbac.sh"), "/subscriptions/s/resourceGroups/r/x/y/z/c"],
                            env={**env, "STEWARD_PRINCIPAL_ID": "not-a-guid"}, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 1
    assert "GUID" in result.stderr
