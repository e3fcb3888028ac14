"""Live mode: the loop that runs real training jobs through an engine (local, Ray, Slurm), job
lists, launch plans, observation, resize."""
