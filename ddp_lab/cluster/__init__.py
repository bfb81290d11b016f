"""The lab's own cluster builders (chapter 09): hosts and Slurm on one machine.

- ``hosts``: hosts from network namespaces on a bridge (``ddp-lab hosts up/down``);
- ``slurm``: Slurm on those hosts (munged, slurmctld, one slurmd per host) and the sbatch
  scripts chapter 09 runs (``ddp-lab slurm up/status/down``).

The chapter's demos that use them (``ddp_lab.two_hosts``, ``ddp_lab.slurm_jobs``) stay at the
top of the package; ``ddp_lab.hosts`` and ``ddp_lab.slurm`` are old paths of these modules
(``ddp_lab/_moved.py``).
"""
