"""isojax: compute-optimal sampling for LLM RL, in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="isojax",
    version="0.1.0",
    description="The IsoCompute Playbook as a program: plan, run and fit RL sampling budgets.",
    # isojax.configs is the top-level configs/ through the isojax/configs link (see
    # configs/__init__.py): find_packages follows it and the wheel holds the files.
    packages=find_packages(include=["isojax", "isojax.*", "launch"]),
    # The shipped demo base models (isojax.base_models.demo_bases): weights, tokenizer,
    # manifest.
    package_data={"isojax": ["assets/base_models/*/*"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7,<0.11",
        "flax>=0.12,<0.13",
        "optax>=0.2.5,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "ml_collections>=1.0,<2",
        "absl-py>=2.1,<3",
        "numpy>=1.26",
        "scipy>=1.11",
        "safetensors>=0.4,<1",
        "tokenizers>=0.20,<1",
        "matplotlib>=3.8,<4",
        "tqdm>=4.66,<5",
        # Real checkpoints and math grading: chat templates, math-verify in a process
        # pool with per-completion timeouts.
        "jinja2>=3.1,<4",
        "math-verify[antlr4-13-2]>=0.9,<1",  # raise_on_error: its alarm as an exception
        "pebble>=5.0,<6",
        # TensorBoard event files beside metrics.jsonl (isojax.metric_writers): pure
        # Python, no TensorFlow.
        "tensorboardX>=2.6,<3",
        # GGUF checkpoints (llama.cpp's format; isojax.models.gguf_checkpoint).
        "gguf>=0.17,<1",
    ],
    extras_require={
        # Real tasks: local dataset files (HF datasets), prepared TFDS datasets without
        # TensorFlow (array_record), and reasoning-gym's procedural datasets.
        "tasks": ["datasets>=3.0,<6", "tensorflow-datasets>=4.9.7,<5", "array_record>=0.7",
                  "reasoning-gym>=0.1.23,<0.2"],
        # launch.aot compiles for TPU topologies on a CPU-only machine: libtpu only,
        # within the same jax range (pip keeps the installed jax, adds its libtpu).
        "aot": ["jax[tpu]>=0.7,<0.11"],
        # Weights & Biases as a metric writer (--config.metric_writers.wandb=True).
        "wandb": ["wandb>=0.17,<1"],
        # The Hugging Face parity tests build random models with transformers + torch.
        # Install torch first (`pip install torch==2.13.0` gives the CPU build here).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100",
                 "transformers>=5.23,<6", "torch>=2.4",
                 # LoRA's adapter export is checked by loading it with PEFT.
                 "peft>=0.17,<1",
                 "datasets>=3.0,<6", "tensorflow-datasets>=4.9.7,<5", "array_record>=0.7",
                 "reasoning-gym>=0.1.23,<0.2",
                 # TensorBoard's reader checks the event files; nbclient runs the colabs.
                 "tensorboard>=2.16,<3", "nbclient>=0.10,<1", "nbformat>=5.9,<6",
                 "ipykernel>=6.29,<8"],
    },
)
