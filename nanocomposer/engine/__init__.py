"""Generation: token ids in, completion ids and their log-probs out, for every stage that samples a model.

    checkpoints           a checkpoint directory or hub id, checked and loaded (ModelLoadError names what is wrong)
    sampling              SamplingConfig, Completion, and what every backend shares
    transformers_backend  TransformersGenerator: `stream()` (continuous batching) and `generate()` (a static
                          batch: the same stream, every prompt added, stepped until empty)
    stream                DecodeStream, the one decode loop: `add(key, prompt_ids, seed)`, `step()` -> finished
    kv_cache, prefix_cache  the stream's KV buffers and the prefix reuse across an episode's turns
    vllm_backend          VLLMGenerator: one `LLM.generate` call per round (GPU)

Every result carries what RL needs: the completion ids (with the stop token when one was generated) and the
log-probability of each under the distribution it was drawn from ("processed" log-probs: after temperature
and top-p; greedy: the raw model distribution), which TRL's importance-sampling correction expects. Each
sequence draws from its own seed, so a request samples the same tokens whatever else is in its batch (up to
floating point). nanocomposer.policy.ModelPolicy turns conversations into prompts and completions into
turns; env/scheduler.py decides when a model's turns go in (its stream, or rounds of act_batch).
"""
