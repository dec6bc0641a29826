"""nanocomposer: the model side of the project (stages' library, policies, generation, the real-time loop).

Importing `nanocomposer.smeared_llama` registers the smeared-key Llama with transformers' Auto classes, so
every loader (ours, TRL's, transformers') reads the embedded base and its trained checkpoints with plain
`AutoModelForCausalLM.from_pretrained(dir)`. Every module here that loads a model or a tokenizer imports it
(tests/test_layers.py checks); the package itself does not, so what needs no model (the agent's bad-input
checks, its session store and registry commands) starts without importing torch and transformers (~7 s).
"""
