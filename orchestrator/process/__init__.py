"""Processes on a host: containment (cgroup, pid namespace, subreaper, process group),
ownership of a pid, children that die with their parent, and the watchdogs."""
