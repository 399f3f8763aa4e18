"""Start a real Kubernetes control plane on loopback, and stop everything it started.

etcd, kube-apiserver (RBAC and the default admission plugins on, Pod Security included),
kube-controller-manager (the controllers the app's drains meet: disruption, namespace, garbage
collector, ReplicaSet, Deployment, DaemonSet, StatefulSet, Job, node lifecycle, pod GC, service
accounts), kube-scheduler, and kwok acting as the kubelet of every Node that carries
``kwok.x-k8s.io/node: fake``. Node and pod behaviour comes from kwok's own Stage files, read from the
Go module cache (``kustomize/stage/node/fast``, ``node/heartbeat-with-lease`` and
``pod/general``: pods honour finalizers and their grace period, unlike kwok's default instant delete).

Authentication: client certificates for the components and the administrator (realkube.pki), and,
when a token webhook is given, bearer tokens reviewed by it: the simulator's identity plane answers
``TokenReview`` for the tokens its managed-identity endpoint issued, as AKS's Entra webhook does, so
the app is the user ``infra/kubernetes`` binds and the real RBAC authorizer judges it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from realkube import build
from realkube.pki import Pki, make_pki

STARTUP_TIMEOUT_S = 120.0
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.0.0.0/24"
# The kwok Stage directories the cluster runs, relative to the kwok module (kustomize/stage/...).
STAGE_DIRS = ("node/fast", "node/heartbeat-with-lease", "pod/general")
# Controllers the app's drains meet; every other one stays off to save the two cores CI has.
CONTROLLERS = (
    "serviceaccount-token-controller", "serviceaccount-controller", "namespace-controller",
    "garbage-collector-controller", "replicaset-controller", "deployment-controller", "daemonset-controller",
    "statefulset-controller", "job-controller", "disruption-controller", "node-lifecycle-controller",
    "taint-eviction-controller", "pod-garbage-collector-controller", "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller", "ttl-controller",
)


class ClusterError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RealCluster:
    run_dir: Path
    pki: Pki
    server: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def admin_kubeconfig(self) -> Path:
        return self.run_dir / "admin.kubeconfig"

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(str(self.pki.cert("admin")), str(self.pki.key("admin")))
        return ctx

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, Any]:
        """One admin request; answers (status, parsed JSON or text)."""
        data = None if body is None else (body if isinstance(body, (str, bytes)) else json.dumps(body))
        if isinstance(data, str):
            data = data.encode()
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def logs(self, name: str, tail: int = 60) -> str:
        path = self.run_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:])

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def spawn(self, name: str, args: list[str]) -> None:
        log = (self.run_dir / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def start_kubelet(self, value: str) -> str:
        """A kwok process acting as the kubelet of every Node annotated ``kwok.x-k8s.io/node: <value>``
        ("fake": the shared one). A story that needs a kubelet to stop gives its node a value of its
        own and stops that process (:meth:`stop_kubelet`): kwok filters nodes by annotation on its
        side (pkg/utils/informer/event.go), so removing the annotation does not stop it."""
        name = "kwok" if value == "fake" else f"kwok-{value}"
        self.spawn(name, [str(build.binaries()["kwok"]), f"--kubeconfig={self.run_dir / 'kwok.kubeconfig'}",
                          f"--config={self.run_dir / 'kwok-stages.yaml'}", "--manage-all-nodes=false",
                          f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={value}",
                          "--node-lease-duration-seconds=40", f"--node-port={free_port()}",
                          "--server-address=127.0.0.1:0"])
        return name

    def stop_kubelet(self, value: str) -> None:
        proc = self.processes.pop(f"kwok-{value}")
        proc.terminate()
        proc.wait(timeout=15)

    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{self.logs(name)}")


def _kubeconfig(server: str, pki: Pki, user: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "realkube", "cluster": {"server": server, "certificate-authority": str(pki.ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(pki.cert(user)),
                                          "client-key": str(pki.key(user))}}],
        "contexts": [{"name": "realkube", "context": {"cluster": "realkube", "user": user}}],
        "current-context": "realkube",
    }, indent=1)


def _webhook_config(url: str, ca_file: str) -> str:
    """The token webhook's kubeconfig-format file (kube-apiserver ``--authentication-token-webhook-config-file``)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "identity", "cluster": {"server": url, "certificate-authority": ca_file}}],
        "users": [{"name": "apiserver", "user": {}}],
        "contexts": [{"name": "webhook", "context": {"cluster": "identity", "user": "apiserver"}}],
        "current-context": "webhook",
    }, indent=1)


# The audit policy: every write to pods (deletes, evictions, creates) at Metadata level, nothing else.
# The lane's oracle reads it: no pod may be deleted by the app except through the Eviction API
# (staging/src/k8s.io/apiserver/pkg/apis/audit/v1/types.go; kubernetes.io/docs/tasks/debug/debug-cluster/audit).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "delete", "deletecollection", "patch", "update"],
         "resources": [{"group": "", "resources": ["pods", "pods/eviction", "nodes"]}]},
        {"level": "None"},
    ],
}


def audit_events(run_dir: Path) -> list[dict[str, Any]]:
    """The API server's audit log (ResponseComplete events), one dict per request."""
    path = run_dir / "audit.log"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete":
                events.append(event)
    return events


def karpenter_crds() -> list[Path]:
    """Karpenter's own CRD manifests for the kinds the app touches (karpenter.sh NodePool, NodeClaim),
    from the module cache (``sigs.k8s.io/karpenter`` pkg/apis/crds). AKS's AKSNodeClass CRD lives in
    github.com/Azure/karpenter-provider-azure, which the Go module proxy does not serve here."""
    directory = build.module_dir("sigs.k8s.io/karpenter", build.KARPENTER_VERSION)
    if directory is None:
        raise ClusterError(f"sigs.k8s.io/karpenter@{build.KARPENTER_VERSION} is not in the Go module cache: "
                           "run `make realkube-build`")
    crds = [directory / "pkg" / "apis" / "crds" / f"karpenter.sh_{kind}.yaml" for kind in ("nodepools", "nodeclaims")]
    missing = [str(p) for p in crds if not p.exists()]
    if missing:
        raise ClusterError(f"Karpenter's CRDs are not where they were: {missing}")
    return crds


def kwok_module_dir() -> Path:
    directory = build.module_dir("sigs.k8s.io/kwok", build.KWOK_VERSION)
    if directory is None:
        raise ClusterError(f"kwok {build.KWOK_VERSION} is not in the Go module cache: run `make realkube-build`")
    return directory


def kwok_stages() -> str:
    """kwok's own Stage files (the directories in STAGE_DIRS), joined into one multi-document config."""
    root = kwok_module_dir() / "kustomize" / "stage"
    docs: list[str] = []
    for sub in STAGE_DIRS:
        for path in sorted((root / sub).glob("*.yaml")):
            if path.name != "kustomization.yaml":
                docs.append(path.read_text().strip())
    if not docs:
        raise ClusterError(f"no kwok stages under {root}")
    return "\n---\n".join(docs) + "\n"


def _wait_ready(cluster: RealCluster, deadline: float) -> None:
    last: Any = None
    while time.monotonic() < deadline:
        cluster.check_alive()
        with contextlib.suppress(OSError):
            status, body = cluster.request("GET", "/readyz", timeout=5)
            if status == 200:
                return
            last = body
        time.sleep(0.3)
    raise ClusterError(f"kube-apiserver not ready in {STARTUP_TIMEOUT_S:.0f} s: {last}\n{cluster.logs('kube-apiserver')}")


def _wait_for(cluster: RealCluster, what: str, check: Any, deadline: float) -> None:
    while time.monotonic() < deadline:
        cluster.check_alive()
        if check():
            return
        time.sleep(0.3)
    raise ClusterError(f"timed out waiting for {what}")


def start(run_dir: Path, *, token_webhook: str | None = None, webhook_ca: str | None = None,
          node_monitor_grace_s: int = 20) -> RealCluster:
    """Start the whole control plane in ``run_dir`` (logs, data, kubeconfigs); raises ClusterError."""
    bins = build.binaries()
    missing = [n for n, p in bins.items() if not p.exists()]
    if missing:
        raise ClusterError(f"binaries missing: {missing}; run `make realkube-build` first")
    run_dir.mkdir(parents=True, exist_ok=True)
    pki = make_pki(run_dir / "pki")
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    cluster = RealCluster(run_dir=run_dir, pki=pki, server=server)
    for user in ("admin", "controller-manager", "scheduler", "kwok"):
        (run_dir / f"{user}.kubeconfig").write_text(_kubeconfig(server, pki, user))

    spawn = cluster.spawn

    (run_dir / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        spawn("etcd", [str(bins["etcd"]), "--name=realkube", f"--data-dir={run_dir / 'etcd'}",
                       f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                       f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                       f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                       f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                       f"--initial-cluster=realkube=http://127.0.0.1:{peer_port}",
                       "--unsafe-no-fsync=true", "--quota-backend-bytes=4294967296", "--log-level=warn"])
        api = [str(bins["kube-apiserver"]), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
               "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
               f"--tls-cert-file={pki.cert('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
               f"--client-ca-file={pki.ca}", "--authorization-mode=Node,RBAC",
               f"--service-account-key-file={pki.service_account_pub}",
               f"--service-account-signing-key-file={pki.service_account_key}",
               "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
               f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
               # The endpoint reconciler refuses a loopback advertise address; nothing here needs the
               # kubernetes Service endpoints.
               "--endpoint-reconciler-type=none",
               f"--audit-policy-file={run_dir / 'audit-policy.json'}", f"--audit-log-path={run_dir / 'audit.log'}",
               "--audit-log-format=json", "--audit-log-mode=blocking",
               "--enable-priority-and-fairness=false", "--profiling=false", "--v=1"]
        if token_webhook:
            hook = run_dir / "token-webhook.kubeconfig"
            hook.write_text(_webhook_config(token_webhook, webhook_ca or ""))
            api += [f"--authentication-token-webhook-config-file={hook}",
                    "--authentication-token-webhook-version=v1",
                    "--authentication-token-webhook-cache-ttl=10s"]
        spawn("kube-apiserver", api)
        _wait_ready(cluster, deadline)
        spawn("kube-controller-manager", [
            str(bins["kube-controller-manager"]), f"--kubeconfig={run_dir / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={run_dir / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={run_dir / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS)}", f"--root-ca-file={pki.ca}",
            f"--service-account-private-key-file={pki.service_account_key}",
            "--use-service-account-credentials=true", f"--node-monitor-grace-period={node_monitor_grace_s}s",
            "--node-monitor-period=2s", "--concurrent-gc-syncs=5", "--v=1"])
        spawn("kube-scheduler", [
            str(bins["kube-scheduler"]), f"--kubeconfig={run_dir / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={run_dir / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={run_dir / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false", "--v=1"])
        stages = run_dir / "kwok-stages.yaml"
        stages.write_text(kwok_stages())
        cluster.start_kubelet("fake")
        # The namespace `default` and its service account exist once the controllers run: every pod
        # create before that is refused by the ServiceAccount admission plugin.
        _wait_for(cluster, "the default service account",
                  lambda: cluster.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                  deadline)
    except BaseException:
        cluster.stop()
        raise
    cluster.admin_kubeconfig.write_text(_kubeconfig(server, pki, "admin"))
    (run_dir / "cluster.json").write_text(json.dumps({
        "server": server, "ca": str(pki.ca), "admin_kubeconfig": str(cluster.admin_kubeconfig),
        "pids": {n: p.pid for n, p in cluster.processes.items()}}, indent=1))
    return cluster


@contextlib.contextmanager
def running(run_dir: Path | None = None, **kwargs: Any) -> Iterator[RealCluster]:
    owned = run_dir is None
    directory = Path(tempfile.mkdtemp(prefix="realkube-")) if owned else run_dir
    assert directory is not None
    cluster = start(directory, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()
        if owned:
            shutil.rmtree(directory, ignore_errors=True)
