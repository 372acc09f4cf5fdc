# Sourced: a shaped link for benchmarks and tests. The cloud side lives in its own network
# namespace behind a veth pair; each direction is shaped with tc's token bucket (uplink on the
# edge's end, downlink on the cloud's). Needs root and iproute2.
#   shaped_link_up          creates the namespace ($shaped_ns) and the pair; the cloud's
#                           address is $shaped_cloud_ip (a subnet no route here covers yet), the
#                           edge's $shaped_edge_ip; returns 1 (with a reason on stderr)
#                           where namespaces or tbf are not available
#   shaped_link_rates U D   shapes to U Mbit/s up and D down (0: unshaped)
#   shaped_link_down        removes everything (safe to call twice)
#   in_cloud_ns CMD...      runs CMD inside the cloud's namespace

shaped_ns=tdm$$ shaped_edge_if=tdme$$ shaped_cloud_if=tdmc$$ shaped_cloud_ip= shaped_edge_ip=

# A /24 for the pair that no route of this machine covers yet but the default one (a machine
# whose own network is 10.231.0.0/16 would send the cloud's address out of its real interface).
shaped_free_subnet() {
  local net
  for net in 10.231.0 172.31.231 192.168.231 100.127.231 10.254.231; do
    if ! ip -4 route show match "$net.2" 2> /dev/null | grep -v '^default' > /dev/null; then echo "$net"; return 0; fi
  done
  return 1
}

shaped_link_up() {
  command -v tc > /dev/null || apt-get install -y --no-install-recommends iproute2 > /dev/null 2>&1 || true
  if [[ $(id -u) != 0 ]]; then echo "shaped link: needs root (network namespaces and tc)" >&2; return 1; fi
  local net
  if ! net=$(shaped_free_subnet); then echo "shaped link: every candidate subnet is routed on this machine" >&2; return 1; fi
  shaped_edge_ip=$net.1 shaped_cloud_ip=$net.2
  if ! ip netns add "$shaped_ns" 2> /dev/null; then echo "shaped link: cannot create a network namespace here" >&2; return 1; fi
  ip link add "$shaped_edge_if" type veth peer name "$shaped_cloud_if" &&
    ip link set "$shaped_cloud_if" netns "$shaped_ns" &&
    ip addr add "$shaped_edge_ip/24" dev "$shaped_edge_if" && ip link set "$shaped_edge_if" up &&
    ip netns exec "$shaped_ns" ip addr add "$shaped_cloud_ip/24" dev "$shaped_cloud_if" &&
    ip netns exec "$shaped_ns" ip link set "$shaped_cloud_if" up &&
    ip netns exec "$shaped_ns" ip link set lo up || { echo "shaped link: cannot set up the veth pair" >&2; return 1; }
  if ! tc qdisc add dev "$shaped_edge_if" root tbf rate 100mbit burst 64kb latency 20ms 2> /dev/null; then
    echo "shaped link: this kernel has no tc token bucket (tbf)" >&2
    return 1
  fi
  tc qdisc del dev "$shaped_edge_if" root
}

# The queue holds 20 ms at the rate (plus the burst), so acknowledgements going the other way
# wait little behind data.
shaped_link_rates() {
  tc qdisc del dev "$shaped_edge_if" root 2> /dev/null || true
  ip netns exec "$shaped_ns" tc qdisc del dev "$shaped_cloud_if" root 2> /dev/null || true
  if [[ $1 != 0 ]]; then tc qdisc add dev "$shaped_edge_if" root tbf rate "${1}mbit" burst 64kb latency 20ms; fi
  if [[ $2 != 0 ]]; then
    ip netns exec "$shaped_ns" tc qdisc add dev "$shaped_cloud_if" root tbf rate "${2}mbit" burst 64kb latency 20ms
  fi
}

shaped_link_down() {
  # Whatever still runs in the namespace was started by this script (a cloud started through
  # in_cloud_ns in the background is a grandchild that `kill $!` does not reach): end it.
  local pids
  pids=$(ip netns pids "$shaped_ns" 2> /dev/null || true)
  if [[ -n $pids ]]; then
    kill $pids 2> /dev/null || true
    sleep 0.5
    kill -9 $pids 2> /dev/null || true
  fi
  ip netns del "$shaped_ns" 2> /dev/null || true
  ip link del "$shaped_edge_if" 2> /dev/null || true
}

in_cloud_ns() { ip netns exec "$shaped_ns" "$@"; }
