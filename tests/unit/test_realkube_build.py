"""The real control plane's build derives its wrapper module from the upstream go.mod (realkube/build.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from realkube.build import Wrapper, kube_ldflags, local_replaces, replace_version, staging_version

KUBERNETES_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
	k8s.io/api v0.0.0
	k8s.io/apiserver v0.0.0
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/apiserver => ./staging/src/k8s.io/apiserver // the server library
	github.com/some/fork v1.0.0 => github.com/other/fork v1.0.1
)
"""

ETCD_GOMOD = """module go.etcd.io/etcd/server/v3

replace (
	go.etcd.io/etcd/api/v3 => ../api
	go.etcd.io/etcd/client/pkg/v3 => ../client/pkg
)

// Bad imports are sometimes causing attempts to pull that code.
replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY
replace go.etcd.io/etcd/pkg/v3 => ../pkg
"""


def test_every_local_path_replace_is_found_and_remote_ones_are_left_alone() -> None:
    assert local_replaces(KUBERNETES_GOMOD) == ["k8s.io/api", "k8s.io/apiserver"]


def test_etcds_sibling_modules_are_found_in_blocks_and_single_lines_but_not_its_import_guard() -> None:
    assert local_replaces(ETCD_GOMOD) == ["go.etcd.io/etcd/api/v3", "go.etcd.io/etcd/client/pkg/v3",
                                          "go.etcd.io/etcd/pkg/v3"]


def test_staging_modules_are_published_as_v0_of_the_same_minor_and_patch() -> None:
    assert staging_version("v1.37.2") == "v0.37.2"
    kube = Wrapper("kubernetes", "k8s.io/kubernetes", "v1.37.2", (), "")
    etcd = Wrapper("etcd", "go.etcd.io/etcd/server/v3", "v3.6.16", (), "")
    assert replace_version(kube, "k8s.io/api") == "v0.37.2"
    assert replace_version(etcd, "go.etcd.io/etcd/api/v3") == "v3.6.16"


def test_the_version_is_stamped_into_both_version_packages_as_the_official_build_does() -> None:
    flags = kube_ldflags("v1.37.2")
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        assert f"-X {pkg}.gitVersion=v1.37.2" in flags
        assert f"-X {pkg}.gitMajor=1" in flags
        assert f"-X {pkg}.gitMinor=37" in flags


def test_a_failed_build_step_says_what_failed_and_how_to_retry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    from realkube import build

    monkeypatch.setenv("REALKUBE_CACHE", str(tmp_path))
    monkeypatch.setattr(build.shutil, "which", lambda _: "/usr/bin/go")

    def refused(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "go: k8s.io/kubernetes@v1.37.2: 403 Forbidden")

    monkeypatch.setattr(build.subprocess, "run", refused)
    assert build.main([]) == 1
    err = capsys.readouterr().err
    assert "BUILD FAILED" in err and "403 Forbidden" in err
    assert "make realkube-build" in err  # how to retry


def test_without_go_the_build_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from realkube import build

    monkeypatch.setenv("REALKUBE_CACHE", str(tmp_path))
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    assert build.main([]) == 1
    assert "Go toolchain" in capsys.readouterr().err
