#!/usr/bin/env bash
# two_nodes.sh GPT2_TRAIN WORKDIR LAUNCH...: gpt2_train as tp 2 x dp 2 on two "nodes" of one
# machine, launched the way docs/cluster.md launches a cluster job (OpenMPI: a hostfile). LAUNCH
# starts 4 ranks (mpiexec -n 4 --oversubscribe ...).
#
# OpenMPI merges every name of this machine (localhost, 127.0.0.1, its hostname) into one node,
# so the hostfile names two hosts that do not resolve, nodea and nodeb, and OpenMPI's ssh agent
# is replaced by a script that runs the remote command here. Each "node" then has its own
# OpenMPI daemon, its own node-local ranks and shared-memory segments, and the ranks of different
# nodes talk over TCP, as on two machines. The script gives each node its own temporary directory
# (as separate machines have): two daemons sharing one session directory, or one hwloc topology
# file, fail at start-up.
#   1. the launcher places ranks 0,1 on nodea and 2,3 on nodeb (mpirun --display-map, by default
#      and with --map-by slot) with node-local ranks 0 1 0 1; with --map-by node it alternates
#      them instead (0,2 on nodea);
#   2. the trainer's start-up summary states the layout, dp 2 and tp 2: by the mesh's rank order
#      (tp fastest) the tp groups are {0,1} and {2,3}, each inside one node;
#   3. every step's loss, gradient norm and rank 0's communication counters equal those of a
#      plain 4-rank launch on one node, bit for bit.
set -eu
bin=$1; dir=$2; shift 2
mkdir -p "$dir"; rm -rf "$dir"/node-* "$dir"/*.txt "$dir"/*.jsonl

cat > "$dir/hostfile" <<'EOF'
nodea slots=2
nodeb slots=2
EOF
# OpenMPI calls the agent as `AGENT [options] HOST COMMAND...`.
cat > "$dir/local-ssh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) host=\$1; shift; break ;; esac; done
node_dir="$dir/node-\$host"
mkdir -p "\$node_dir"
OMPI_MCA_orte_tmpdir_base=\$node_dir OMPI_MCA_btl_vader_backing_directory=\$node_dir TMPDIR=\$node_dir
export OMPI_MCA_orte_tmpdir_base OMPI_MCA_btl_vader_backing_directory TMPDIR
exec sh -c "\$*"
EOF
chmod +x "$dir/local-ssh"
nodes=(--hostfile "$dir/hostfile" --mca plm_rsh_agent "$dir/local-ssh")

shape=(--layers 2 --heads 2 --d-model 32 --seq 32 --batch 4 --vocab 259 --steps 4 --sample-tokens 0 --progress lines
       --tp 2 --zero 1)
# "rank node" for each rank of the first job map mpirun prints.
job_map() { awk '/Data for node:/ { node = $4 } /Process rank:/ { for (i = 1; i < NF; ++i) if ($i == "rank:") print $(i + 1), node }' "$1" | sort -n -u; }
steps() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),"lr":[^,]*,"grad_norm":\([^,]*\),.*"comm":\(.*\)$/\1 \2 \3 \4/p' "$1"; }

"$@" "$bin" "${shape[@]}" --metrics "$dir/plain.jsonl" > "$dir/plain.txt"
"$@" "${nodes[@]}" --display-map "$bin" "${shape[@]}" --metrics "$dir/nodes.jsonl" > "$dir/nodes.txt"

if [ "$(job_map "$dir/nodes.txt" | tr '\n' ' ')" != "0 nodea 1 nodea 2 nodeb 3 nodeb " ]; then
  echo "FAIL: expected ranks 0,1 on nodea and 2,3 on nodeb, the job map says:"; job_map "$dir/nodes.txt"; exit 1
fi
# shellcheck disable=SC2016  # the ranks' shells expand these, not this one
local_ranks=$("$@" "${nodes[@]}" sh -c 'echo $OMPI_COMM_WORLD_RANK $OMPI_COMM_WORLD_LOCAL_RANK' | sort -n | tr '\n' ' ')
[ "$local_ranks" = "0 0 1 1 2 0 3 1 " ] || { echo "FAIL: node-local ranks (rank local): $local_ranks"; exit 1; }
"$@" "${nodes[@]}" --map-by slot --display-map true > "$dir/by_slot.txt"
if [ "$(job_map "$dir/by_slot.txt" | tr '\n' ' ')" != "0 nodea 1 nodea 2 nodeb 3 nodeb " ]; then
  echo "FAIL: --map-by slot should fill nodea first:"; job_map "$dir/by_slot.txt"; exit 1
fi
"$@" "${nodes[@]}" --map-by node --display-map true > "$dir/by_node.txt"
if [ "$(job_map "$dir/by_node.txt" | tr '\n' ' ')" != "0 nodea 1 nodeb 2 nodea 3 nodeb " ]; then
  echo "FAIL: --map-by node should alternate the nodes:"; job_map "$dir/by_node.txt"; exit 1
fi

grep -q "; dp 2, ZeRO-1; tp 2; recompute none" "$dir/nodes.txt" \
  || { echo "FAIL: the start-up summary does not state dp 2 x tp 2"; cat "$dir/nodes.txt"; exit 1; }
[ "$(steps "$dir/nodes.jsonl" | wc -l)" -eq 4 ] || { echo "FAIL: expected 4 steps"; cat "$dir/nodes.txt"; exit 1; }
if ! diff <(steps "$dir/plain.jsonl") <(steps "$dir/nodes.jsonl"); then
  echo "FAIL: two nodes' losses, norms or counters differ from one node's"; exit 1
fi
echo "ok: tp 2 x dp 2 on two nodes (ranks 0,1 | 2,3; local ranks 0 1 0 1) = one node, bit for bit"
