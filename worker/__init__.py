"""Workers of the fusion service: the Celery app, the fuse task and the pipeline it runs.

A worker process serves the queues `fuse.<target>` of the targets its host can compile for, claims
jobs through the shared job store's leases, runs `autofusion_worker.pipeline.run_job`, and keeps a
heartbeat (with its targets, while its consumer is live) and a lease sweep going in the background.

Importing the package imports nothing else, so that `autofusion --help` stays light: Celery is
loaded when a worker starts (`autofusion_worker.cli.run_worker`).
"""
