# Network namespaces for the cross-namespace attack scripts (t_rt_netns_*.sh; sourced after lib.sh).
# `ns_up PREFIX N` makes a bridge ${NSP}br in the host namespace and four namespaces on it, on
# 10.77.N.0/24: ${NSP}s the server (IP_S 10.77.N.2), ${NSP}c a client (IP_C .3), ${NSP}x a listed
# attacker (IP_X .4), ${NSP}u a fourth tenant (IP_U .5). NSP is PREFIX and this shell's pid, so a
# run never meets the names of another run (or a killed one's leftovers); each script has a PREFIX
# (atke, atkl, atkn...) and an N of its own, and tests/netns uses 10.231-10.232. No route, no
# forwarding and no firewall rule changes: the bridge has no address. The EXIT trap (ns_exit) ends
# the script's processes (lib.sh's `cleanup`), then deletes the namespaces and the bridge, on
# failure and on SIGTERM or SIGINT too.
NSP=
ns_up() {
  NSP=$1$$ N=$2
  IP_S=10.77.$N.2 IP_C=10.77.$N.3 IP_X=10.77.$N.4 IP_U=10.77.$N.5
  IN_S=(ip netns exec "${NSP}s") IN_C=(ip netns exec "${NSP}c") IN_X=(ip netns exec "${NSP}x") IN_U=(ip netns exec "${NSP}u")
  ip link add "${NSP}br" type bridge || return 1
  ip link set "${NSP}br" up || return 1
  local i=2 r
  for r in s c x u; do
    ip netns add "$NSP$r" || return 1
    ip link add "$NSP$r" type veth peer name eth0 netns "$NSP$r" || return 1
    ip link set "$NSP$r" master "${NSP}br" up &&
      ip -n "$NSP$r" addr add "10.77.$N.$i/24" dev eth0 &&
      ip -n "$NSP$r" link set eth0 up &&
      ip -n "$NSP$r" link set lo up || return 1
    i=$((i + 1))
  done
}
ns_down() {
  [ -n "$NSP" ] || return 0
  local r
  for r in s c x u; do ip netns del "$NSP$r" 2>/dev/null; ip link del "$NSP$r" 2>/dev/null; done
  ip link del "${NSP}br" 2>/dev/null
  NSP=
  return 0
}
# "${IN_S[@]}" CMD... runs CMD in the server's namespace (IN_C, IN_X, IN_U the others'): an array,
# not a function, so that `"${IN_S[@]}" CMD &` sets $! to CMD's pid (ip netns exec execs it)
# and lib.sh's `cleanup` ends CMD itself. "${NOBODY[@]}" CMD runs CMD as nobody (as_nobody for
# a command that is not a shell function).
NOBODY=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
# ns_exit: the EXIT trap's work, signals ignored while it runs (timeout(1) signals the script and
# then its whole process group: a second SIGTERM would end the trap half-way and leave the
# namespaces). A script with more to undo sets its own EXIT trap ending in ns_exit. SIGTERM and
# SIGINT end the script through its EXIT trap.
ns_exit() { trap '' INT TERM; cleanup; ns_down; }
trap ns_exit EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
