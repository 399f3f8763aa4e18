"""Fleet facts shared by the jobs: scope, GPU sizes, the managed stack, node truth, pool cloning, the write gate."""
