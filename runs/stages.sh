# Sourced by the preset scripts (runs/smol.sh, runs/tiny.sh, runs/tiny_long.sh, ...): stage banners, and each
# stage's wall time, so a preset's time budget can be read stage by stage (runs/$RUN/stage_times.tsv: stage,
# seconds; written also when a stage fails, up to and including the failed one).
#   stage <key> <banner...>   ends the stage before (if any) and starts <key>
#   stages_done               ends the last stage, writes and prints the table and the total
#   train_chain <preset>      the stages cpt, sft and rl with recipes/<preset>/{cpt,sft,rl}.yaml, each one
#                             from the model before (runs/$RUN/cpt, runs/$RUN/sft, runs/$RUN/rl)
_stage_key="" _stage_t0=$(date +%s) _stages_t0=$(date +%s) _stage_rows=""
stage() {
  _stage_end
  _stage_key=$1; shift
  echo; echo "== $* ($(date +%H:%M:%S))"
}
_stage_end() {
  local now; now=$(date +%s)
  [ -z "$_stage_key" ] || _stage_rows+="$_stage_key"$'\t'"$((now - _stage_t0))"$'\n'
  _stage_t0=$now _stage_key=""
}
_stages_write() {
  mkdir -p "runs/$RUN"
  printf 'stage\tseconds\n%s' "$_stage_rows" > "runs/$RUN/stage_times.tsv"
}
stages_done() {
  _stage_end; _stages_write
  echo; echo "== done in $(( ($(date +%s) - _stages_t0) / 60 )) min (stage times: runs/$RUN/stage_times.tsv)"
  awk -F'\t' 'NR > 1 { printf "  %-10s %4d min %02d s\n", $1, $2 / 60, $2 % 60 }' "runs/$RUN/stage_times.tsv"
}
train_chain() {
  local preset=$1
  stage cpt "1. continued pretraining -> runs/$RUN/cpt"
  $PY train_cpt.py --config "recipes/$preset/cpt.yaml" --run "$RUN"

  stage sft "2. tool-call SFT -> runs/$RUN/sft"
  $PY train_sft.py --config "recipes/$preset/sft.yaml" --run "$RUN" --model_name_or_path "runs/$RUN/cpt" \
    --check_tasks artifacts/data/tasks/val

  stage rl "3. GRPO in the harness -> runs/$RUN/rl"
  $PY train_rl.py --config "recipes/$preset/rl.yaml" --run "$RUN" --model_name_or_path "runs/$RUN/sft"
}
# a failed stage: keep the times measured so far
_stages_on_exit() {
  [ -z "$_stage_key" ] || { _stage_end; _stages_write; echo "stage times so far: runs/$RUN/stage_times.tsv" >&2; }
}
trap _stages_on_exit EXIT
