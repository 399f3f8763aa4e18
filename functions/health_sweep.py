"""Timer: sweep the fleet's GPU nodes and publish one event per unhealthy condition episode."""

import azure.functions as func

from shared import entrypoints

bp = func.Blueprint()


@bp.function_name("health_sweep")
@bp.timer_trigger(arg_name="timer", schedule="%SWEEP_SCHEDULE%", run_on_startup=False, use_monitor=True)
def health_sweep(timer: func.TimerRequest) -> None:
    entrypoints.run_health_sweep()
