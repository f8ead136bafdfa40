"""The launchers of ``pax launch``: processes on this machine (``local``), Cloud TPU slices
through Google's ``gcloud`` (``cloud_tpu``), a SLURM job (``slurm``) and a Kubernetes JobSet
(``kubernetes``), all supervised the same way (``supervise``)."""
