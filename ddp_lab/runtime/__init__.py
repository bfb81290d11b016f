"""The runtime: what makes multi-process cells work in a notebook kernel.

Learners use it through ``import ddp_lab as dl`` (``dl.spawn``, ``%%ddp``, ``dl.start``,
``%%ranks``); they do not need to read it. The teaching code is at the top of ``ddp_lab/``.

- ``launcher``: ``dl.spawn``, the notebook-safe ``mp.spawn`` (timeouts, stack dumps,
  rank-ordered output, cleanup); its parts ``_shipping`` (the job sent to the zygote),
  ``_supervise`` (the ranks followed to the end) and ``_failures`` (the errors raised);
- ``_zygote``, ``_rank``: the fork server that has torch imported; what runs in one rank;
- ``persistent``, ``_rank_group``, ``_rank_faults``, ``_rank_loop``: persistent ranks (``dl.start``, ``%%ranks``,
  ``dl.pull``/``dl.push``, ``dl.status``, ``dl.stop``);
- ``magic``: the ``%%ddp`` and ``%%ranks`` / ``%ranks`` magics.
"""
