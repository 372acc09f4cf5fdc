#!/usr/bin/env bash
# The README's tour, exactly as written: its setup, cloud and edge blocks (the bash blocks
# between <!-- tour:NAME --> and <!-- /tour:NAME -->) run on fresh checkouts (the files git
# tracks, and this build as build/release), the cloud in one network namespace and the edge in
# another, joined by a veth pair. The one edit a reader makes is CLOUD=, set to the cloud's
# address. Both start from the samples' config files; the edge copies the identity folder the
# cloud issued, trains, and reports its test accuracy; the cloud stops cleanly on SIGTERM.
# Needs root and ip(8) for the namespaces: skips (77) without them, fails under CI=true.
# Usage: readme_tour.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1") src=$(realpath "$2")
work=$(mktemp -d)
ns_cloud=tourc$$ ns_edge=toure$$ if_cloud=tourc$$ if_edge=toure$$
cloud_ip=10.88.0.1 edge_ip=10.88.0.2
cloud_pid=
cleanup() {
  [[ -n $cloud_pid ]] && kill -- -"$cloud_pid" 2> /dev/null
  wait 2> /dev/null
  ip netns del "$ns_cloud" 2> /dev/null || true
  ip netns del "$ns_edge" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in cloud.log edge.log; do [[ -f $work/$f ]] && { echo "--- $f"; tail -n 30 "$work/$f"; }; done
  exit 1
}
skip() {
  [[ ${CI:-} == true ]] && fail "$1 (CI runs as root with iproute2 installed by scripts/setup.sh)"
  echo "SKIP: $1"
  exit 77
}

[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v ip > /dev/null || skip "ip(8) is missing (Debian iproute2)"
ip netns add "$ns_cloud" 2> /dev/null || skip "cannot create a network namespace here"
ip netns add "$ns_edge" || fail "cannot create a second network namespace"
ip link add "$if_cloud" type veth peer name "$if_edge" || fail "cannot make a veth pair"
ip link set "$if_cloud" netns "$ns_cloud" && ip link set "$if_edge" netns "$ns_edge" || fail "cannot move the veth ends"
ip -n "$ns_cloud" addr add "$cloud_ip/24" dev "$if_cloud" && ip -n "$ns_cloud" link set "$if_cloud" up &&
  ip -n "$ns_cloud" link set lo up || fail "cannot set up the cloud's namespace"
ip -n "$ns_edge" addr add "$edge_ip/24" dev "$if_edge" && ip -n "$ns_edge" link set "$if_edge" up &&
  ip -n "$ns_edge" link set lo up || fail "cannot set up the edge's namespace"

# A block of the README: the lines of the bash fence between its markers.
block() {
  awk -v name="$1" '
    $0 == "<!-- tour:" name " -->" { inside = 1; next }
    $0 == "<!-- /tour:" name " -->" { inside = 0 }
    inside && !/^```/ { print }' "$src/README.md"
}
setup=$(block setup) cloud=$(block cloud) edge=$(block edge)
[[ -n $setup && -n $cloud && -n $edge ]] || fail "README.md lacks one of the tour's blocks (setup, cloud, edge)"
grep -q '^CLOUD=' <<< "$setup" || fail "the tour's setup block sets no CLOUD="
setup=$(sed "s/^CLOUD=[^ ]*/CLOUD=$cloud_ip/" <<< "$setup")  # the reader's one edit

# Fresh checkouts: what git tracks (and the files not yet committed, when run from a work
# tree), with this build where the README's commands expect it.
checkout() {
  mkdir -p "$1/build"
  git -C "$src" ls-files -z -co --exclude-standard | tar -C "$src" --null -T - -cf - | tar -C "$1" -xf -
  ln -s "$build" "$1/build/release"
}
checkout "$work/cloud" && checkout "$work/edge"

# The cloud machine: its block as written, in its namespace, in a process group of its own.
setsid ip netns exec "$ns_cloud" bash -euo pipefail -c "cd '$work/cloud'; $setup
$cloud" > "$work/cloud.log" 2>&1 &
cloud_pid=$!
for _ in $(seq 1 300); do
  grep -q 'listening on' "$work/cloud.log" && break
  kill -0 "$cloud_pid" 2> /dev/null || fail "the cloud's block ended before the service listened"
  sleep 0.1
done
grep -q "listening on wss://0.0.0.0:8443" "$work/cloud.log" || fail "the service does not listen on 0.0.0.0:8443"
[[ -f $work/cloud/hospital-a/client.crt ]] || fail "the cloud's block issued no identity folder hospital-a"

# "Copy the folder hospital-a to the edge machine"; there, the edge's block as written.
cp -r "$work/cloud/hospital-a" "$work/edge/"
if ! ip netns exec "$ns_edge" bash -euo pipefail -c "cd '$work/edge'; $setup
$edge" > "$work/edge.log" 2>&1; then
  fail "the edge's block failed"
fi
acc=$(grep -o '"test_accuracy":[0-9.]*' "$work/edge/metrics.jsonl" | tail -1 | cut -d: -f2)
[[ -n $acc ]] || fail "the edge wrote no test accuracy to metrics.jsonl (its config's metrics-json)"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }' || fail "one epoch reached test accuracy $acc (< 0.80)"
grep -q "hospital-a" "$work/cloud.log" || fail "the cloud's log does not name the edge"

# The service stops cleanly on SIGTERM: the block's last command is the service.
serve_pid=$(pgrep -P "$cloud_pid" | head -n 1 || true)
[[ -n $serve_pid ]] || serve_pid=$cloud_pid  # bash may run a block's last command in its own place
[[ $(cat "/proc/$serve_pid/comm" 2> /dev/null) == tandem-cloud ]] || fail "no tandem-cloud process under the cloud's block"
kill -TERM "$serve_pid"
status=0
wait "$cloud_pid" || status=$?
cloud_pid=
((status == 0)) || fail "the cloud's block exited with status $status after SIGTERM"
echo "PASS: the README's tour: cloud at $cloud_ip and edge at $edge_ip in their own namespaces, each from its" \
  "config file; test accuracy $acc after one epoch; the cloud stopped cleanly"
