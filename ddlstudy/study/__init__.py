"""A study: the use case x configuration x repeat matrix of a plan, run here one
cell after another (``matrix``) or as Slurm jobs (``slurm``)."""
