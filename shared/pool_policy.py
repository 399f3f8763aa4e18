"""How pool requests are judged and followed: limits, timeouts, the sample job.

One frozen value built once from the app settings (``Settings.pool_requests``) so that validation
and the pool-request state machine take their limits as an argument instead of reading the
environment; tests build it directly. Every setting is read with a literal name through
:mod:`shared.env` (the infrastructure tests derive the list of settings from those calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.env import SettingError, env_int, env_list, env_str

DEFAULT_SAMPLE_JOB_IMAGE = "mcr.microsoft.com/azuredocs/samples-tf-mnist-demo:gpu"
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
    - ``sample_job_image`` (POOL_REQUEST_SAMPLE_JOB_IMAGE): the image of the sample GPU job
      (default: the AKS documentation's TensorFlow MNIST GPU sample).
    - ``sample_job_args`` (POOL_REQUEST_SAMPLE_JOB_ARGS, comma-separated, default
      ``--max_steps,500``): the container's args.
    - ``sample_job_namespace`` (POOL_REQUEST_SAMPLE_JOB_NAMESPACE, default ``default``).
    - ``default_taints`` (POOL_REQUEST_DEFAULT_TAINTS, comma-separated, default
      ``sku=gpu:NoSchedule`` as in the seed): taints of a pool whose request names none.
    - ``allowed_sizes`` (POOL_REQUEST_ALLOWED_SIZES, comma-separated, default empty = every NVIDIA
      size in shared.gpu_sizes): restricts which sizes teams may ask for.
    - ``poll_interval_s`` (POOL_REQUEST_POLL_INTERVAL_S, default 15): how soon the reconciler looks
      at a request again while Azure or the nodes are still busy.
    """

    max_payload_bytes: int = 65536
    max_count: int = 1000
    create_timeout_s: int = 3600
    validate_timeout_s: int = 1200
    sample_job_timeout_s: int = 900
    sample_job_image: str = DEFAULT_SAMPLE_JOB_IMAGE
    sample_job_args: tuple[str, ...] = ("--max_steps", "500")
    sample_job_namespace: str = "default"
    default_taints: tuple[str, ...] = DEFAULT_TAINTS
    allowed_sizes: tuple[str, ...] = ()
    poll_interval_s: int = 15

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
            sample_job_args=env_list("POOL_REQUEST_SAMPLE_JOB_ARGS", ("--max_steps", "500"), env=env),
            sample_job_namespace=env_str("POOL_REQUEST_SAMPLE_JOB_NAMESPACE", "default", env=env),
            default_taints=env_list("POOL_REQUEST_DEFAULT_TAINTS", DEFAULT_TAINTS, env=env),
            allowed_sizes=env_list("POOL_REQUEST_ALLOWED_SIZES", (), env=env),
            poll_interval_s=env_int("POOL_REQUEST_POLL_INTERVAL_S", 15, env=env, minimum=1, maximum=3600),
        )
        policy.check()
        return policy

    def check(self) -> None:
        """Refuse taints and sizes that validation would refuse in a request (errors name the setting)."""
        from shared import gpu_sizes
        from shared.pool_request import parse_taint

        for taint in self.default_taints:
            if parse_taint(taint) is None:
                raise SettingError(f"setting POOL_REQUEST_DEFAULT_TAINTS has an invalid taint {taint!r}: "
                                   "write key=value:Effect (NoSchedule, PreferNoSchedule or NoExecute)")
        for size in self.allowed_sizes:
            entry = gpu_sizes.lookup(size)
            if entry is None or not entry.is_nvidia:
                raise SettingError(f"setting POOL_REQUEST_ALLOWED_SIZES names {size!r}, which is not an NVIDIA GPU "
                                   "size of shared/gpu_sizes.py")
