#!/usr/bin/env bash
# podman as it works on the project's machines (root, no CAP_SYS_RESOURCE,
# hybrid cgroups): Debian's runc as the runtime (crun cannot apply the
# rlimits there and rejects the cgroup layout), and rlimits no higher than
# this process may set. Podman asks for 1048576 open files and processes by
# default, which runc's setrlimit is refused without CAP_SYS_RESOURCE; podman
# itself runs with at most kernel.pid_max processes.
#
#   deploy/docker/podman.sh build|run|create ...   # adds the flags below
#   deploy/docker/podman.sh ANY OTHER COMMAND ...  # plain podman, with runc
#
# VAEDECODE_OCI_RUNTIME overrides the runtime (default /usr/sbin/runc).
set -euo pipefail
runtime=${VAEDECODE_OCI_RUNTIME:-/usr/sbin/runc}
command -v podman >/dev/null || { echo "podman.sh: podman is not installed (tools/setup.sh installs it)" >&2; exit 1; }
[ -x "$runtime" ] || { echo "podman.sh: no OCI runtime at $runtime (Debian's runc)" >&2; exit 1; }
case "${1:-}" in
  build|run|create)
    cmd=$1
    shift
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max)
    [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
    [ "$nofile" = unlimited ] && nofile=1048576
    exec podman --runtime "$runtime" "$cmd" --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" "$@"
    ;;
  *)
    exec podman --runtime "$runtime" "$@"
    ;;
esac
