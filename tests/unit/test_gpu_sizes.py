"""The GPU size catalogue knows NVIDIA sizes, their MIG profiles, and why other sizes are refused."""

from __future__ import annotations

import pytest

from shared.fleet import gpu_sizes
from shared.fleet.gpu_sizes import SizeKind


@pytest.mark.parametrize(("size", "model", "gpus", "vcpus", "family"), [
    pytest.param("Standard_NC4as_T4_v3", "T4", 1, 4, "standardNCASv3_T4Family", id="the smallest T4 size"),
    pytest.param("Standard_NC64as_T4_v3", "T4", 4, 64, "standardNCASv3_T4Family", id="the four-GPU T4 size"),
    pytest.param("Standard_NC24ads_A100_v4", "A100 80GB", 1, 24, "StandardNCADSA100v4Family", id="A100 PCIe"),
    pytest.param("Standard_ND96asr_v4", "A100 40GB", 8, 96, "standardNDASv4_A100Family", id="A100 40GB SXM"),
    pytest.param("Standard_ND96isr_H100_v5", "H100 80GB", 8, 96, "standardNDSH100v5Family", id="H100"),
    pytest.param("Standard_ND96isr_H200_v5", "H200", 8, 96, "standardNDISRH200V5Family", id="H200"),
])
def test_a_known_nvidia_size_reports_its_gpus_vcpus_and_quota_family(size: str, model: str, gpus: int, vcpus: int,
                                                                     family: str) -> None:
    entry = gpu_sizes.lookup(size)
    assert entry is not None and entry.is_nvidia
    assert (entry.gpu_model, entry.gpus, entry.vcpus, entry.family) == (model, gpus, vcpus, family)


def test_lookup_ignores_case_and_returns_the_canonical_spelling() -> None:
    entry = gpu_sizes.lookup("  standard_nc24ADS_a100_V4 ")
    assert entry is not None and entry.name == "Standard_NC24ads_A100_v4"


@pytest.mark.parametrize(("size", "kind"), [
    pytest.param("Standard_NC4as_T4_v3", SizeKind.NVIDIA, id="T4 is NVIDIA"),
    pytest.param("Standard_NV36ads_A10_v5", SizeKind.NVIDIA, id="A10 is NVIDIA"),
    pytest.param("Standard_NV4as_v4", SizeKind.AMD, id="NVv4 is AMD"),
    pytest.param("Standard_ND96isr_MI300X_v5", SizeKind.AMD, id="MI300X is AMD"),
    pytest.param("Standard_D4s_v5", SizeKind.NOT_GPU, id="a D-series size is not a GPU size"),
    pytest.param("Standard_E8as_v6", SizeKind.NOT_GPU, id="an E-series size is not a GPU size"),
    pytest.param("Standard_NC999_future_v9", SizeKind.UNKNOWN, id="an unknown N-series size is unknown"),
    pytest.param("gpu-large", SizeKind.UNKNOWN, id="a made-up name is unknown"),
])
def test_sizes_are_classified_by_why_they_are_or_are_not_acceptable(size: str, kind: SizeKind) -> None:
    assert gpu_sizes.classify(size) is kind


@pytest.mark.parametrize("size", ["Standard_NC4as_T4_v3", "Standard_NV36ads_A10_v5", "Standard_ND128isr_NDR_GB200_v6"])
def test_gpus_that_mig_cannot_partition_have_no_profiles(size: str) -> None:
    entry = gpu_sizes.lookup(size)
    assert entry is not None and not entry.mig_capable and entry.mig_profile("MIG1g") is None


@pytest.mark.parametrize(("size", "profile", "slice_", "instances"), [
    pytest.param("Standard_ND96asr_v4", "MIG1g", "1g.5gb", 7, id="A100 40GB: 1g.5gb x7"),
    pytest.param("Standard_ND96asr_v4", "MIG3g", "3g.20gb", 2, id="A100 40GB: 3g.20gb x2"),
    pytest.param("Standard_NC24ads_A100_v4", "MIG1g", "1g.10gb", 7, id="A100 80GB: 1g.10gb x7"),
    pytest.param("Standard_NC24ads_A100_v4", "MIG7g", "7g.80gb", 1, id="A100 80GB: 7g.80gb x1"),
    pytest.param("Standard_ND96isr_H100_v5", "MIG2g", "2g.20gb", 3, id="H100: 2g.20gb x3"),
    pytest.param("Standard_NC40ads_H100_v5", "MIG4g", "4g.47gb", 1, id="H100 NVL: 4g.47gb x1"),
    pytest.param("Standard_ND96isr_H200_v5", "MIG1g", "1g.18gb", 7, id="H200: 1g.18gb x7"),
])
def test_mig_profiles_name_the_resource_the_device_plugin_advertises(size: str, profile: str, slice_: str,
                                                                     instances: int) -> None:
    entry = gpu_sizes.lookup(size)
    assert entry is not None and entry.mig_capable
    found = entry.mig_profile(profile)
    assert found is not None
    assert (found.slice, found.instances_per_gpu, found.resource) == (slice_, instances, f"nvidia.com/mig-{slice_}")


def test_every_mig_capable_gpu_offers_all_five_profiles() -> None:
    for entry in gpu_sizes.nvidia_sizes():
        if entry.mig_capable:
            assert tuple(p.name for p in entry.mig_profiles) == gpu_sizes.MIG_PROFILE_NAMES, entry.name
            assert entry.gpu_model.startswith(("A100", "H100", "H200")), entry.name


def test_the_catalogue_has_no_duplicate_sizes() -> None:
    names = [s.name.lower() for s in gpu_sizes.CATALOGUE]
    assert len(names) == len(set(names))
