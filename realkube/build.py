"""Build a real Kubernetes control plane from Go modules: kube-apiserver, kube-controller-manager,
kube-scheduler (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3) and kwok (sigs.k8s.io/kwok).

Nothing is downloaded except through the Go module proxy, and no binary is committed: the binaries go
into a cache outside the repository, keyed by version, so a second run costs seconds.

Why a wrapper module: ``go install k8s.io/kubernetes/cmd/kube-apiserver@v1.37.2`` is refused because
that go.mod replaces its staging modules (k8s.io/api, k8s.io/apiserver, ...) with local paths, and
``go install`` refuses modules with replace directives. A module of our own that requires
k8s.io/kubernetes and replaces each of those staging modules with its published release (v0.37.2 for
v1.37.2) builds. The replace list is *derived* from the upstream go.mod's replace block, never
listed by hand, so a staging module added upstream cannot slip past. etcd's server module does the
same with its sibling modules (go.etcd.io/etcd/api/v3 => ../api, ...), replaced by the same version.

Flags follow the official build (kubernetes hack/lib/golang.sh and hack/lib/version.sh):
``CGO_ENABLED=0``, tags ``selinux,notest``, and the version ``-X`` ldflags on
k8s.io/component-base/version and k8s.io/client-go/pkg/version (without them the binaries report
v0.0.0, and kwok picks flags by that version).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
# Karpenter's CRDs (karpenter.sh NodePool and NodeClaim) come from its module's pkg/apis/crds, read
# from the Go module cache (realkube.cluster.karpenter_crds); nothing is built from it.
KARPENTER_VERSION = "v1.14.1"  # newer releases need a newer Go than 1.26.8

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class BuildError(RuntimeError):
    """A build step failed; the message says which and how to retry."""


def cache_root() -> Path:
    env = os.environ.get("REALKUBE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-fleet-steward" / "realkube"


def bin_dir() -> Path:
    key = f"k8s-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}_kwok-{KWOK_VERSION}"
    return cache_root() / key / "bin"


def binaries() -> dict[str, Path]:
    return {name: bin_dir() / name for name in BINARIES}


def built() -> bool:
    return all(path.is_file() and os.access(path, os.X_OK) for path in binaries().values())


@dataclass(frozen=True)
class Wrapper:
    """One wrapper module: requires ``module@version``, replaces its local-path replaces, builds ``mains``."""

    name: str
    module: str
    version: str
    mains: tuple[str, ...]
    ldflags: str
    tags: str = ""


def _go(args: list[str], cwd: Path, what: str) -> str:
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS=os.environ.get("GOFLAGS", "") + " -mod=mod")
    proc = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"{what} failed (go {' '.join(args)} in {cwd}, exit {proc.returncode}):\n{proc.stderr[-4000:]}\n"
            f"Retry with `make realkube-build` (the Go module cache keeps what was downloaded); "
            f"remove {cwd} to start that module over."
        )
    return proc.stdout


def module_dir(module: str, version: str) -> Path | None:
    """Where the Go module cache holds ``module@version`` (None when it is not there)."""
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off")
    proc = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                          env=env, cwd=str(Path.home()))
    if proc.returncode != 0:
        return None
    directory = json.loads(proc.stdout).get("Dir")
    return Path(directory) if directory and Path(directory).is_dir() else None


def upstream_gomod(module: str, version: str, cwd: Path) -> str:
    out = _go(["mod", "download", "-json", f"{module}@{version}"], cwd, f"download {module}@{version}")
    return Path(json.loads(out)["GoMod"]).read_text()


_REPLACE_LINE = re.compile(r"^\s*(?:replace\s+)?(\S+)(?:\s+\S+)?\s*=>\s*(\.\.?/\S*)\s*$")


def local_replaces(gomod: str) -> list[str]:
    """Module paths the upstream go.mod replaces with a local directory (``=> ./...`` or ``=> ../...``).

    Those are what ``go install`` refuses and what a wrapper must point at published releases.
    A replace to ``./FORBIDDEN_DEPENDENCY`` (etcd's guard against importing itself) names no release
    and is left out.
    """
    found: list[str] = []
    in_block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].rstrip()
        if line.startswith("replace ("):
            in_block = True
            continue
        if in_block and line.strip() == ")":
            in_block = False
            continue
        if in_block or line.startswith("replace "):
            m = _REPLACE_LINE.match(line)
            if m and "FORBIDDEN" not in m.group(2):
                found.append(m.group(1))
    return found


def staging_version(kubernetes_version: str) -> str:
    """k8s.io/kubernetes v1.X.Y publishes its staging modules as v0.X.Y."""
    major, minor, patch = kubernetes_version.lstrip("v").split(".", 2)
    if major != "1":
        raise BuildError(f"unexpected Kubernetes version {kubernetes_version}")
    return f"v0.{minor}.{patch}"


def kube_ldflags(version: str) -> str:
    major, minor, _ = version.lstrip("v").split(".", 2)
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "go-module-proxy",
        "buildDate": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    flags = [f"-X k8s.io/{pkg}.{key}={val}"
             for key, val in values.items() for pkg in ("client-go/pkg/version", "component-base/version")]
    return " ".join(["-s", "-w", *flags])


def wrappers() -> list[Wrapper]:
    return [
        Wrapper(
            name="kubernetes", module="k8s.io/kubernetes", version=KUBERNETES_VERSION,
            mains=tuple(f"k8s.io/kubernetes/cmd/{c}" for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")),
            ldflags=kube_ldflags(KUBERNETES_VERSION), tags="selinux,notest",
        ),
        Wrapper(name="etcd", module="go.etcd.io/etcd/server/v3", version=ETCD_VERSION,
                mains=("go.etcd.io/etcd/server/v3",), ldflags="-s -w"),
        Wrapper(name="kwok", module="sigs.k8s.io/kwok", version=KWOK_VERSION,
                mains=("sigs.k8s.io/kwok/cmd/kwok",), ldflags="-s -w"),
    ]


def replace_version(wrapper: Wrapper, module: str) -> str:
    if wrapper.module == "k8s.io/kubernetes":
        return staging_version(wrapper.version)
    return wrapper.version


def write_wrapper(wrapper: Wrapper, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "go.mod").exists():
        (work / "go.mod").write_text("module realkube.local/wrapper\n\ngo 1.26.0\n")
    upstream = upstream_gomod(wrapper.module, wrapper.version, work)
    replaces = local_replaces(upstream)
    lines = [f"module realkube.local/{wrapper.name}", "", "go 1.26.0", ""]
    godebug = re.search(r"^godebug .*$", upstream, re.M)
    if godebug:
        lines += [godebug.group(0), ""]
    lines += [f"require {wrapper.module} {wrapper.version}", ""]
    lines += [f"tool {main}" for main in wrapper.mains] + [""]
    if replaces:
        lines.append("replace (")
        lines += [f"\t{mod} => {mod} {replace_version(wrapper, mod)}" for mod in replaces]
        lines += [")", ""]
    (work / "go.mod").write_text("\n".join(lines))
    (work / "replaces.json").write_text(json.dumps(replaces, indent=1))


def build_wrapper(wrapper: Wrapper, work: Path, out: Path, log: bool = True) -> None:
    write_wrapper(wrapper, work)
    if log:
        print(f"realkube: {wrapper.name} {wrapper.version}: resolving modules", flush=True)
    _go(["mod", "tidy"], work, f"go mod tidy for {wrapper.name}")
    for main in wrapper.mains:
        name = "etcd" if wrapper.name == "etcd" else main.rsplit("/", 1)[-1]
        if log:
            print(f"realkube: building {name}", flush=True)
        args = ["build", "-trimpath", "-o", str(out / name), "-ldflags", wrapper.ldflags]
        if wrapper.tags:
            args += ["-tags", wrapper.tags]
        _go([*args, main], work, f"go build of {name}")


def build(force: bool = False) -> dict[str, Path]:
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain (go 1.26) is needed to build the real control plane; it is not on PATH")
    out = bin_dir()
    if built() and not force and module_dir("sigs.k8s.io/karpenter", KARPENTER_VERSION) is not None:
        return binaries()
    out.mkdir(parents=True, exist_ok=True)
    src = out.parent / "src"
    for wrapper in wrappers():
        mains_out = [out / ("etcd" if wrapper.name == "etcd" else m.rsplit("/", 1)[-1]) for m in wrapper.mains]
        if all(p.exists() for p in mains_out) and not force:
            continue
        build_wrapper(wrapper, src / wrapper.name, out)
    _go(["mod", "download", f"sigs.k8s.io/karpenter@{KARPENTER_VERSION}"], src, "download of Karpenter's CRDs")
    missing = [n for n, p in binaries().items() if not p.exists()]
    if missing:
        raise BuildError(f"built, yet missing: {missing}")
    return binaries()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache has the binaries")
    parser.add_argument("--print-bin-dir", action="store_true")
    args = parser.parse_args(argv)
    if args.print_bin_dir:
        print(bin_dir())
        return 0
    try:
        paths = build(force=args.force)
    except BuildError as err:
        print(f"realkube: BUILD FAILED: {err}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"realkube: {name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
