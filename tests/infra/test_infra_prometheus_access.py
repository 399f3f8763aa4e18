"""The DCGM signal's Azure side: Monitoring Data Reader on each Azure Monitor workspace the app queries, for
the app's identity only, and the settings that point the app at them (docs/signals-dcgm.md)."""

from __future__ import annotations

from infra_facts import REPO, bicep, variable

MONITORING_DATA_READER = "b0d8363b-8ddd-447d-831f-62ca05bff136"


def test_each_listed_workspace_grants_monitoring_data_reader_to_the_apps_identity() -> None:
    main = bicep("main.bicep")
    module = main["modules"]["prometheusAccess"]
    assert module["config"]["loop_type"]["detail"]["array_name"] == "prometheusWorkspaceIds"
    params = module["config"]["config"]["params"]
    assert params["principalId"]["operator"]["operands"]["operand_1"] == "identity"
    source = (REPO / "infra" / "app" / "prometheus-access.bicep").read_text(encoding="utf-8")
    assert f"var monitoringDataReader = '{MONITORING_DATA_READER}'" in source
    assert "scope: workspace" in source and "Microsoft.Monitor/accounts@" in source


def test_the_dcgm_settings_are_deployed_empty_unless_the_operator_sets_them() -> None:
    main = bicep("main.bicep")
    steward = variable(main, "stewardSettings")
    assert "SIGNALS_PROMETHEUS" in steward and steward["SIGNALS_XID_OVERRIDES"] == ""
    assert main["parameters"]["signalsPrometheus"]["default"] == ""
    assert main["parameters"]["prometheusWorkspaceIds"]["default"] == []
