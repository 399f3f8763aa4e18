"""How pool requests are judged and followed: limits, timeouts, the sample job.

One frozen value built once from the app settings (``Settings.pool_requests``) so that validation
and the pool-request state machine take their limits as an argument instead of reading the
environment; tests build it directly. Every setting is read with a literal name through
:mod:`shared.kernel.env` (the infrastructure tests derive the list of settings from those calls).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.kernel.env import SettingError, env_choice, env_int, env_list, env_str

if TYPE_CHECKING:
    from shared.settings import Settings

# The sample GPU job's default image: NVIDIA's CUDA vectorAdd sample, pinned by digest so that what runs
# on every new pool is exactly what was reviewed (a tag can be moved; a digest cannot).
#   tag:    nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04
#   digest: sha256:79fa5da2e71ce9169d41b0a67f8575b8f713fd1fb3e6de306774fcfede3a4fe6, as a kubelet reports
#           that tag's repo digest in node.status.images (a public `kubectl get nodes -o json` capture);
#           catalogue: https://catalog.ngc.nvidia.com/orgs/nvidia/teams/k8s/containers/cuda-sample/tags
# Re-pin it whenever the image is changed: `crane digest <image:tag>` (or `docker buildx imagetools
# inspect <image:tag>`) gives the digest to write here, in infra/main.bicep and in
# local.settings.example.json. It runs its vectorAdd binary with no arguments and prints "Test PASSED".
DEFAULT_SAMPLE_JOB_IMAGE = (
    "nvcr.io/nvidia/k8s/cuda-sample@sha256:79fa5da2e71ce9169d41b0a67f8575b8f713fd1fb3e6de306774fcfede3a4fe6")
# <registry>/<repository>@sha256:<64 hex>: the registry is a host name (with a dot, or ``localhost``),
# optionally with a port, so that the image can never silently resolve to Docker Hub; the repository
# path components follow the distribution reference grammar (distribution/reference regexp.go).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PINNED_IMAGE = re.compile(
    r"(?P<registry>(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)+|localhost)"
    r"(?::[0-9]{1,5})?)"
    rf"/(?P<repository>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"@sha256:(?P<digest>[0-9a-f]{64})")


def pinned_image_problem(image: str) -> str | None:
    """Why ``image`` is not a ``<registry>/<repository>@sha256:<64 hex>`` reference, or None when it is."""
    if _PINNED_IMAGE.fullmatch(image):
        return None
    if "@sha256:" not in image:
        return "it is not pinned by digest"
    return "it is not <registry>/<repository>@sha256:<64 lowercase hex>"
DEFAULT_TAINTS: tuple[str, ...] = ("sku=gpu:NoSchedule",)


@dataclass(frozen=True)
class PoolRequestPolicy:
    """Limits and timings of the pool-request job.

    - ``max_payload_bytes`` (POOL_REQUEST_MAX_BYTES, default 65536): messages larger than this are
      rejected before they are parsed (a storage queue message is at most 64 KiB anyway).
    - ``max_count`` (POOL_REQUEST_MAX_COUNT, default 1000, AKS's per-pool limit): the largest
      ``count`` / ``autoscale.max`` a request may ask for.
    - ``create_timeout_s`` (POOL_REQUEST_CREATE_TIMEOUT_S, default 3600): from acceptance until the
      pool reports ``provisioningState: Succeeded``; after that the request fails.
    - ``validate_timeout_s`` (POOL_REQUEST_VALIDATE_TIMEOUT_S, default 1200): how long the stack
      (nodes Ready, GPUs allocatable, DCGM label, NPD conditions) may take to become healthy.
    - ``sample_job_timeout_s`` (POOL_REQUEST_SAMPLE_JOB_TIMEOUT_S, default 900): how long the
      sample GPU job may take to complete.
    - ``sample_job_image`` (POOL_REQUEST_SAMPLE_JOB_IMAGE): the image of the sample GPU job, pinned by
      digest, ``<registry>/<repository>@sha256:<64 hex>`` (checked at start; default: NVIDIA's CUDA
      vectorAdd sample, see DEFAULT_SAMPLE_JOB_IMAGE). It runs as a non-root user (uid
      shared.pools.sample_job.SAMPLE_JOB_UID) under Pod Security ``restricted``: an image must work so.
    - ``sample_job_args`` (POOL_REQUEST_SAMPLE_JOB_ARGS, comma-separated, default none): the
      container's args (the vectorAdd sample takes none).
    The job runs in the app's own namespace (STEWARD_NAMESPACE), never in a namespace of this policy.
    - ``default_taints`` (POOL_REQUEST_DEFAULT_TAINTS, comma-separated, default
      ``sku=gpu:NoSchedule`` as in the seed): taints of a pool whose request names none.
    - ``allowed_sizes`` (POOL_REQUEST_ALLOWED_SIZES, comma-separated, default empty = every NVIDIA
      size in shared.fleet.gpu_sizes): restricts which sizes teams may ask for.
    - ``poll_interval_s`` (POOL_REQUEST_POLL_INTERVAL_S, default 15): how soon the reconciler looks
      at a request again while Azure or the nodes are still busy.
    - ``failed_pool_action`` (POOL_REQUEST_FAILED_POOL_ACTION, ``delete`` | ``scaleToZero``, default
      ``delete``): what becomes of a pool this request created when its provisioning fails or its
      validation (stack check, sample job) fails or times out, so that it is not left billing. The
      outcome says which was done (or why nothing was: workload pods already run on it).
    """

    max_payload_bytes: int = 65536
    max_count: int = 1000
    create_timeout_s: int = 3600
    validate_timeout_s: int = 1200
    sample_job_timeout_s: int = 900
    sample_job_image: str = DEFAULT_SAMPLE_JOB_IMAGE
    sample_job_args: tuple[str, ...] = ()
    default_taints: tuple[str, ...] = DEFAULT_TAINTS
    allowed_sizes: tuple[str, ...] = ()
    poll_interval_s: int = 15
    failed_pool_action: str = "delete"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PoolRequestPolicy:
        """Read the POOL_REQUEST_* settings (``env`` defaults to the process environment)."""
        policy = cls(
            max_payload_bytes=env_int("POOL_REQUEST_MAX_BYTES", 65536, env=env, minimum=1024, maximum=1_048_576),
            max_count=env_int("POOL_REQUEST_MAX_COUNT", 1000, env=env, minimum=1, maximum=1000),
            create_timeout_s=env_int("POOL_REQUEST_CREATE_TIMEOUT_S", 3600, env=env, minimum=60),
            validate_timeout_s=env_int("POOL_REQUEST_VALIDATE_TIMEOUT_S", 1200, env=env, minimum=30),
            sample_job_timeout_s=env_int("POOL_REQUEST_SAMPLE_JOB_TIMEOUT_S", 900, env=env, minimum=30),
            sample_job_image=env_str("POOL_REQUEST_SAMPLE_JOB_IMAGE", DEFAULT_SAMPLE_JOB_IMAGE, env=env),
            sample_job_args=env_list("POOL_REQUEST_SAMPLE_JOB_ARGS", (), env=env),
            default_taints=env_list("POOL_REQUEST_DEFAULT_TAINTS", DEFAULT_TAINTS, env=env),
            allowed_sizes=env_list("POOL_REQUEST_ALLOWED_SIZES", (), env=env),
            poll_interval_s=env_int("POOL_REQUEST_POLL_INTERVAL_S", 15, env=env, minimum=1, maximum=3600),
            failed_pool_action=env_choice("POOL_REQUEST_FAILED_POOL_ACTION", "delete", ("delete", "scaleToZero"),
                                          env=env),
        )
        policy.check()
        return policy

    def check(self) -> None:
        """Refuse taints and sizes that validation would refuse in a request, and a sample-job image that
        is not pinned by digest (errors name the setting)."""
        from shared.fleet import gpu_sizes
        from shared.pools.rules import parse_taint

        problem = pinned_image_problem(self.sample_job_image)
        if problem is not None:
            raise SettingError(f"setting POOL_REQUEST_SAMPLE_JOB_IMAGE is {self.sample_job_image!r}: {problem}; write "
                               "<registry>/<repository>@sha256:<digest> (get the digest of a tag with `crane digest "
                               "<image:tag>`)")

        for taint in self.default_taints:
            if parse_taint(taint) is None:
                raise SettingError(f"setting POOL_REQUEST_DEFAULT_TAINTS has an invalid taint {taint!r}: "
                                   "write key=value:Effect (NoSchedule, PreferNoSchedule or NoExecute)")
        for size in self.allowed_sizes:
            entry = gpu_sizes.lookup(size)
            if entry is None or not entry.is_nvidia:
                raise SettingError(f"setting POOL_REQUEST_ALLOWED_SIZES names {size!r}, which is not an NVIDIA GPU "
                                   "size of shared/fleet/gpu_sizes.py")


def of(settings: Settings) -> PoolRequestPolicy:
    """The pool-request policy of ``settings``: the loaded one, or the defaults (Settings built by hand in tests)."""
    return settings.pool_requests if settings.pool_requests is not None else PoolRequestPolicy()
