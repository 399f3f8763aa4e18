"""Fleet migration: the plan, maintenance windows, and the steps that replace an unmanaged GPU pool."""
