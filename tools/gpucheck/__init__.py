"""``tools/gpu-check``'s parts: the carry of packages a GPU machine lacks, the runner, the checks."""
