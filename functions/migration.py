"""Timer: plan migrations of unmanaged GPU pools to managed ones and start what the plan allows."""

import azure.functions as func

from shared import entrypoints

bp = func.Blueprint()


@bp.function_name("migration_planner")
@bp.timer_trigger(arg_name="timer", schedule="%MIGRATION_SCHEDULE%", run_on_startup=False, use_monitor=True)
def migration_planner(timer: func.TimerRequest) -> None:
    entrypoints.run_migration_planner()
