"""vlarun: real-time VLA inference on robot and edge.

``vlarun.Policy`` (loaded on first use, so ``import vlarun`` stays light) is the one class that
runs a model: ``Policy.load(name).predict(image, instruction, state=...)``. A robot loop of your
own runs it through ``vlarun.runtime.robot.control.Robot`` (an edge server or none).
"""

__version__ = "0.1.0"

__all__ = ["Policy", "__version__"]


def __getattr__(name: str):
    if name == "Policy":  # torch and the model code load here, not on `import vlarun`
        from vlarun.policy.base import Policy

        return Policy
    raise AttributeError(f"module 'vlarun' has no attribute {name!r}")
