"""vlarun: real-time VLA inference on robot and edge."""

__version__ = "0.1.0"
