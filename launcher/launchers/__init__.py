"""How the ranks are started (cluster.launcher: torchrun or deepspeed): the pure argv, env
and hostfile of each form. Below the schedulers, which wrap that command in a job script."""
