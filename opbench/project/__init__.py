"""``opbench project``: a training step's time and memory per GPU, and the best parallel layout, from this cluster's
own measurements (docs/project.md)."""
