"""PYTHON_ISOLATE_WORKER_DEPENDENCIES=1 is load-bearing while the app binds ``func.CloudEvent``.

The platform's Python worker bundles its own azure-functions, older than the 1.25 release that added
``CloudEvent`` (Azure/azure-functions-python-library#314); on Python <= 3.12 the worker's copy wins
unless the app isolates its dependencies (Azure/azure-functions-python-worker#1642). So as long as a
function takes a ``func.CloudEvent``, the deployed settings must keep the flag, requirements.txt
must pin an azure-functions that has the type, and api.bicep must say why next to the setting.
"""

from __future__ import annotations

import ast

from infra_facts import FUNCTIONS, INFRA, bicep, python_files, variable
from packaging.version import Version
from requirements_lock import top_level


def functions_taking_a_cloud_event() -> list[str]:
    found = []
    for path in python_files(FUNCTIONS):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for arg in node.args.args:
                    if arg.annotation is not None and ast.unparse(arg.annotation) == "func.CloudEvent":
                        found.append(f"{path.name}:{node.name}")
    return found


def test_a_function_binds_the_cloud_event_type() -> None:
    assert functions_taking_a_cloud_event(), "no function takes func.CloudEvent: this flag may no longer be needed"


def test_the_worker_isolation_flag_is_set_while_cloud_event_is_bound() -> None:
    assert functions_taking_a_cloud_event()
    assert variable(bicep("app/api.bicep"), "hostSettings")["PYTHON_ISOLATE_WORKER_DEPENDENCIES"] == "1"


def test_the_pinned_azure_functions_has_the_cloud_event_type() -> None:
    import azure.functions as func

    [spec] = list(top_level()["azure-functions"].specifier)
    assert Version(spec.version) >= Version("1.25.0")
    assert hasattr(func, "CloudEvent")


def test_the_bicep_says_why_the_flag_is_load_bearing() -> None:
    text = (INFRA / "app" / "api.bicep").read_text(encoding="utf-8")
    before_flag = text.split("PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'")[0].rsplit("}", 1)[-1]
    assert "Load-bearing" in before_flag and "CloudEvent" in before_flag and "1642" in before_flag
