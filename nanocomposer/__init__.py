"""nanocomposer: the model side of the project (stages' library, policies, generation, the real-time loop).

Importing the package registers the smeared-key Llama (`nanocomposer.smeared_llama`) with transformers' Auto
classes, so every loader in the project (ours, TRL's, transformers') reads the embedded base and its trained
checkpoints with plain `AutoModelForCausalLM.from_pretrained(dir)`.
"""

from nanocomposer import smeared_llama  # noqa: F401  (registration is the import's effect)
