"""A Meta-World task as a vision-language-action environment: 128 px camera image + proprio.

``MetaWorldEnv("drawer-open-v3")`` wraps one Meta-World v3 environment and returns

* ``obs = {"image": uint8 (S, S, 3) upright RGB, "state": float32 (4,)}``,
* ``env.instruction`` (e.g. ``"open the drawer"``) for the language side,
* ``action`` in Box([-1, 1]^4): xyz end-effector delta and gripper effort (Meta-World's own),
* ``terminated`` on success, ``truncated`` after the task's ``max_steps``.

State: the first 4 entries of Meta-World's observation (hand xyz + gripper opening). The other 14
of the first 18 entries are privileged object poses, and the last 3 are the goal; a VLA sees
those only through the camera, as on a real robot, so neither is in ``state``. The goal is also
zeroed in Meta-World's own observation (``_partially_observable``); the scripted expert gets the
true goal explicitly through :meth:`MetaWorldEnv.expert_action`. ``goal_in_state=True`` appends
the goal xyz (7 values): Meta-World's own MT observation, for the labelled goal-in-state
policies (``mt10g-*``) only.

Randomisation: every reset draws the object and goal positions from Meta-World's task space with
Meta-World's own seeded sampler (``seeded_rand_vec``: ``np_random.uniform`` over
``_random_reset_space``, the same draw ``metaworld.MT1`` uses to build its 50 fixed tasks) but
seeded per episode, so any integer seed is a distinct, reproducible episode: the same seed gives
the same initial state and the same images. (``MT1``'s pickled task list is not used: it caps a
benchmark at 50 goals and would put pickle on our path.)

Rendering: a plain ``mujoco.Renderer`` on the Meta-World model with shadows, reflections, skybox
and multisample anti-aliasing off, which is what brings a 128 px frame to ~6 ms on a CPU
(Mesa software GL through EGL or OSMesa; 12 ms with anti-aliasing, 85 ms with shadows). The GL
backend must be chosen before MuJoCo is imported, so this module does it at import:
``MUJOCO_GL`` if set, else the first of ``egl``/``osmesa`` that can render in a probe
subprocess; see :func:`select_gl_backend`.

Camera: the default ``"workspace"`` is a free camera on the robot's right (+x), level with the
robot's side of the table, looking down 40 degrees at the table centre (azimuth 145). It keeps
the whole reachable workspace and every fixture in frame, the goal marker and the puck are
~5.5 px wide at 128 px (~3.5 px from Meta-World's XML cameras, which spend most of the frame on
the floor, the table legs and the robot base), and the drawer/door/window handles, which face
the robot, are seen from the front. The arm enters from the top left and covers the goal mostly
at the end of an episode, when the gripper is on it.

The XML cameras are available too; the ``corner*`` ones are mounted upside down in the XML, so
their images are rotated 180 degrees to come out upright (a vertical flip alone would mirror
them).
"""

from __future__ import annotations

import atexit
import importlib
import os
import subprocess
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

# --- GL backend: must be settled before the first `import mujoco` (it reads MUJOCO_GL once). --

_GL_PACKAGES = {"egl": "libegl1", "osmesa": "libosmesa6"}

# Renders one frame of a one-box model; os._exit skips interpreter teardown, where MuJoCo's EGL
# context can print spurious errors after eglTerminate.
_PROBE = """
import os, mujoco
m = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='.1'/></worldbody></mujoco>")
d = mujoco.MjData(m)
r = mujoco.Renderer(m, 8, 8)
r.update_scene(d)
r.render()
r.close()
print("ok", flush=True)
os._exit(0)
"""


def _probe_backend(backend: str) -> str | None:
    """None if ``backend`` can render in a fresh interpreter, else the reason it cannot."""
    env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{type(err).__name__}: {err}"
    if done.returncode == 0 and "ok" in done.stdout:
        return None
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {done.returncode}"


def select_gl_backend() -> str:
    """Choose MuJoCo's headless GL backend and export it as ``MUJOCO_GL``.

    ``MUJOCO_GL`` set by the user wins. Otherwise ``egl`` (GPU, or Mesa's software EGL) then
    ``osmesa`` are tried, each in a subprocess, because a failed attempt leaves PyOpenGL bound
    to the wrong platform in the process that made it. The choice goes into ``os.environ`` so
    worker processes inherit it without probing again.

    Raises:
        RuntimeError: neither backend can render; the message names the Debian package.
    """
    requested = os.environ.get("MUJOCO_GL", "").strip().lower()
    if requested:
        return requested
    # MuJoCo's egl/osmesa modules refuse to load under a different PYOPENGL_PLATFORM.
    platform = os.environ.get("PYOPENGL_PLATFORM", "").strip().lower()
    candidates = (platform,) if platform in _GL_PACKAGES else ("egl", "osmesa")
    reasons = {}
    for backend in candidates:
        reason = _probe_backend(backend)
        if reason is None:
            os.environ["MUJOCO_GL"] = backend
            if "mujoco" in sys.modules:
                # MuJoCo was imported before us and picked its GLContext from an unset MUJOCO_GL
                # (GLFW, which needs a display): point it at the backend that works.
                context_cls = importlib.import_module(f"mujoco.{backend}").GLContext
                sys.modules["mujoco.gl_context"].GLContext = context_cls
                sys.modules["mujoco"].GLContext = context_cls
            return backend
        reasons[backend] = reason
    raise RuntimeError(
        "MuJoCo cannot render offscreen: "
        + "; ".join(f"{b} failed ({r})" for b, r in reasons.items())
        + ". Install the Debian package libegl1 (EGL, preferred with a GPU) or libosmesa6 "
        "(OSMesa software rendering), e.g. `sudo apt-get install libosmesa6`, or set MUJOCO_GL."
    )


try:
    GL_BACKEND: str | None = select_gl_backend()
    _GL_ERROR: str | None = None
except RuntimeError as _err:  # raised again when an env that renders is built
    GL_BACKEND, _GL_ERROR = None, str(_err)

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402
from gymnasium import spaces  # noqa: E402

from vlarun.sim.tasks import METAWORLD_HORIZON, TaskSpec, get_task  # noqa: E402

# --- cameras -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CameraSpec:
    """Where the image is taken from.

    Either a camera defined in Meta-World's XML (``model_camera``), or a MuJoCo free camera given
    by the point it looks at and its distance/azimuth/elevation in metres and degrees.

    Attributes:
        model_camera: Name of an XML camera; None for a free camera.
        rotate_180: Rotate the rendered image 180 degrees (XML cameras mounted upside down).
        lookat: Free camera target point (world xyz, metres).
        distance: Free camera distance from ``lookat``.
        azimuth: Free camera azimuth (degrees; 90 looks along +y, the robot's forward axis).
        elevation: Free camera elevation (degrees; negative looks down).
        follow: A body whose position the free camera keeps ``lookat`` relative to (``lookat``
            is then an offset from that body, refreshed every frame): a camera mounted on it.
    """

    model_camera: str | None = None
    rotate_180: bool = False
    lookat: tuple[float, float, float] = (0.0, 0.7, 0.16)
    distance: float = 1.1
    azimuth: float = 145.0
    elevation: float = -40.0
    follow: str | None = None

    def __post_init__(self) -> None:
        if self.follow is not None and self.model_camera is not None:
            raise ValueError(f"follow applies to free cameras only, not {self.model_camera!r}")
        if len(self.lookat) != 3:
            raise ValueError(f"lookat must be xyz, got {self.lookat}")
        if self.distance <= 0:
            raise ValueError(f"camera distance must be > 0, got {self.distance}")
        if not -90.0 <= self.elevation <= 90.0:
            raise ValueError(f"camera elevation must be in [-90, 90], got {self.elevation}")


CAMERAS: dict[str, CameraSpec] = {
    # On the robot's right, 40 degrees down onto the table centre (see the module docstring).
    "workspace": CameraSpec(lookat=(0.0, 0.7, 0.16), distance=1.1, azimuth=145.0, elevation=-40.0),
    # The mirror image of "workspace" on the robot's left: the second view of the deep policies.
    # Two views 110 degrees apart fix an object's depth, which one view leaves ambiguous (a puck
    # far away and a puck low in the frame look alike from one camera).
    "left": CameraSpec(lookat=(0.0, 0.7, 0.16), distance=1.1, azimuth=35.0, elevation=-40.0),
    "corner": CameraSpec("corner", rotate_180=True),
    "corner2": CameraSpec("corner2", rotate_180=True),
    "corner3": CameraSpec("corner3", rotate_180=True),
    "corner4": CameraSpec("corner4", rotate_180=True),
    # A wrist camera: rides with the hand (fixed orientation, as Meta-World keeps the gripper's),
    # 0.38 m from a point just below and ahead of the fingers, so the fingers, the object being
    # grasped and a nearby goal fill the frame and the view changes every step. XML "gripperPOV"
    # would be the literal one, but it sits inside the gripper geometry and renders black.
    "wrist": CameraSpec(
        lookat=(0.0, 0.04, -0.07), distance=0.38, azimuth=145.0, elevation=-40.0, follow="hand"
    ),
    "topview": CameraSpec("topview"),
    "behindGripper": CameraSpec("behindGripper"),
}

DEFAULT_CAMERA = "workspace"


@dataclass(frozen=True)
class EnvConfig:
    """Settings of one :class:`MetaWorldEnv`.

    Attributes:
        task: Task name from ``vlarun.sim.tasks.TASKS``.
        image_size: Side of the square camera image in pixels.
        seed: Seed of the first episode when ``reset()`` is called without one.
        camera: Key of ``CAMERAS``.
        max_steps: Episode limit; None uses the task's ``max_steps``.
        render: False skips the camera entirely (no "image" in observations): physics-only runs.
        antialias: Multisample anti-aliasing (Meta-World's 4x); costs ~2x render time on CPU.
        extra_cameras: Further views (keys of ``CAMERAS``), rendered at the same size; with any,
            observations carry ``"views"`` (V, S, S, 3): ``camera`` first, then these.
        goal_in_state: The state ends with the goal xyz (7 values): Meta-World's own MT setting
            (``partially_observable=False``), for the labelled goal-in-state policies only.
    """

    task: str
    image_size: int = 128
    seed: int | None = None
    camera: str = DEFAULT_CAMERA
    max_steps: int | None = None
    render: bool = True
    antialias: bool = False
    extra_cameras: tuple[str, ...] = ()
    goal_in_state: bool = False

    def __post_init__(self) -> None:
        get_task(self.task)  # raises ValueError listing valid names
        if not 8 <= self.image_size <= 2048:
            raise ValueError(f"image_size must be in 8..2048, got {self.image_size}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        for cam in (self.camera, *self.extra_cameras):
            if cam not in CAMERAS:
                raise ValueError(f"unknown camera {cam!r}; valid: {', '.join(CAMERAS)}")
        if self.max_steps is not None and not 0 < self.max_steps <= METAWORLD_HORIZON:
            raise ValueError(f"max_steps must be in 1..{METAWORLD_HORIZON}, got {self.max_steps}")


def env_views(cfg: Any) -> dict[str, Any]:
    """:class:`MetaWorldEnv` keyword arguments that render the views a policy config
    (``VLAConfig.views``) names: its first view as ``camera``, the rest as ``extra_cameras``; and
    the goal in the state where the config was trained with it (``VLAConfig.goal_in_state``)."""
    views = getattr(cfg, "views", ())
    kwargs: dict[str, Any] = {"goal_in_state": True} if getattr(cfg, "goal_in_state", False) else {}
    if views:
        kwargs.update(camera=views[0], extra_cameras=tuple(views[1:]))
    return kwargs


def _camera(spec: CameraSpec) -> tuple[str | Any, bool]:
    """What ``Renderer.update_scene`` takes for ``spec`` (an XML name or a free camera), and
    whether its image is rotated 180 degrees."""
    if spec.model_camera is not None:
        return spec.model_camera, spec.rotate_180
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    cam.lookat[:] = spec.lookat  # an offset from the followed body's position, set per frame
    cam.distance = spec.distance
    cam.azimuth = spec.azimuth
    cam.elevation = spec.elevation
    return cam, spec.rotate_180


# Renderers still open at exit are closed before MuJoCo's own atexit eglTerminate (handlers run
# last-registered first; ours is registered after the first context exists), which otherwise
# prints "Exception ignored" tracebacks from EGL context destructors.
_OPEN_ENVS: weakref.WeakSet[MetaWorldEnv] = weakref.WeakSet()
_ATEXIT_REGISTERED = False


def _close_open_envs() -> None:
    for env in list(_OPEN_ENVS):
        env.close()


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task with camera image + proprio observations; see the module docstring.

    Args:
        task: Task name (``vlarun.sim.tasks``), e.g. ``"reach-v3"``.
        image_size: Side of the square RGB image.
        seed: Seed of the first episode if ``reset()`` gets none (later ones continue its stream).
        camera: Key of ``CAMERAS``; default ``"workspace"``.
        max_steps: Episode limit; default the task's.
        render: False to skip rendering (observations without "image").
        antialias: Enable 4x multisampling (slower).
        extra_cameras: Further views; observations then carry ``"views"`` (V, S, S, 3).
        goal_in_state: Append the goal xyz to the state (see :class:`EnvConfig`).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(
        self,
        task: str,
        image_size: int = 128,
        seed: int | None = None,
        camera: str = DEFAULT_CAMERA,
        max_steps: int | None = None,
        render: bool = True,
        antialias: bool = False,
        extra_cameras: tuple[str, ...] = (),
        goal_in_state: bool = False,
    ) -> None:
        self.config = EnvConfig(
            task,
            image_size,
            seed,
            camera,
            max_steps,
            render,
            antialias,
            tuple(extra_cameras),
            goal_in_state,
        )
        self.task: TaskSpec = get_task(task)
        self.instruction: str = self.task.instruction
        self.max_steps: int = max_steps if max_steps is not None else self.task.max_steps
        self.render_mode = "rgb_array"
        self.episode_seed: int | None = None
        self._renderer: mujoco.Renderer | None = None
        self._policy: Any = None
        self._raw_obs: np.ndarray | None = None
        self._steps = 0
        self._seeded = False

        from metaworld.env_dict import ALL_V3_ENVIRONMENTS  # heavy; imports all 50 envs

        self._mw = ALL_V3_ENVIRONMENTS[task]()
        # What metaworld's task builders do, minus the frozen 50-goal pool: task "set", positions
        # re-drawn at every reset from the env's own np_random (seeded per episode in reset()).
        self._mw._set_task_called = True
        self._mw._freeze_rand_vec = False
        self._mw.seeded_rand_vec = True
        self._mw._partially_observable = True  # goal zeroed in Meta-World's obs (the default)

        low = self._mw.sawyer_observation_space.low[:4].astype(np.float32)
        high = self._mw.sawyer_observation_space.high[:4].astype(np.float32)
        if goal_in_state:  # a goal is a point the hand reaches: the hand's bounds (the observed
            # goal can leave a task's own ``goal_space``, e.g. door-open's, which is offset)
            low, high = np.concatenate((low, low[:3])), np.concatenate((high, high[:3]))
        obs_spaces: dict[str, spaces.Space] = {"state": spaces.Box(low, high, dtype=np.float32)}
        if render:
            shape = (image_size, image_size, 3)
            obs_spaces["image"] = spaces.Box(0, 255, shape, dtype=np.uint8)
            if extra_cameras:
                views = (1 + len(extra_cameras), *shape)
                obs_spaces["views"] = spaces.Box(0, 255, views, dtype=np.uint8)
            self._setup_renderer()
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)

    # -- rendering ------------------------------------------------------------------------------

    def _setup_renderer(self) -> None:
        global _ATEXIT_REGISTERED
        if _GL_ERROR is not None:
            raise RuntimeError(_GL_ERROR)
        model, size = self._mw.model, self.config.image_size
        # Why each setting: shadows need an extra depth pass per light (~6x the frame time in
        # software GL), reflections re-render the scene mirrored in the table, and multisampling
        # doubles the fill cost; none of them help a 128 px policy input.
        model.vis.quality.shadowsize = 0
        if not self.config.antialias:
            model.vis.quality.offsamples = 0
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, size)
        try:
            self._renderer = mujoco.Renderer(model, size, size)
        except Exception as err:  # a backend that probed fine can still fail (driver, memory)
            backend = os.environ.get("MUJOCO_GL", "?")
            package = _GL_PACKAGES.get(backend, "libegl1 or libosmesa6")
            raise RuntimeError(
                f"MuJoCo renderer with MUJOCO_GL={backend} failed ({err}); install the Debian "
                f"package {package} or set MUJOCO_GL to another backend (egl, osmesa)"
            ) from err
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        # Skybox: not in view from "workspace"; the XML corner cameras show black there instead.
        flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = False
        names = (self.config.camera, *self.config.extra_cameras)
        self._cameras = [_camera(CAMERAS[name]) for name in names]
        self._follow = [
            None if CAMERAS[n].follow is None else (CAMERAS[n].follow, np.array(CAMERAS[n].lookat))
            for n in names
        ]
        _OPEN_ENVS.add(self)
        if not _ATEXIT_REGISTERED:
            atexit.register(_close_open_envs)
            _ATEXIT_REGISTERED = True

    def render(self, view: int = 0) -> np.ndarray:  # type: ignore[override]
        """The image of camera ``view`` (0 = ``camera``), uint8 (S, S, 3), upright."""
        if self._renderer is None:
            raise RuntimeError("this env was built with render=False (or is closed)")
        camera, rotate_180 = self._cameras[view]
        follow = self._follow[view]
        if follow is not None:
            body, offset = follow
            camera.lookat[:] = self._mw.data.body(body).xpos + offset
        self._renderer.update_scene(self._mw.data, camera=camera)
        image = self._renderer.render()  # a fresh array, already flipped to top-row-first
        if rotate_180:
            image = np.ascontiguousarray(image[::-1, ::-1])
        return image

    # -- episode --------------------------------------------------------------------------------

    def _obs(self) -> dict[str, np.ndarray]:
        assert self._raw_obs is not None
        obs = {"state": self._raw_obs[:4].astype(np.float32)}
        if self.config.goal_in_state:  # the same goal the auxiliary targets carry
            obs["state"] = np.concatenate((obs["state"], self.targets[3:]))
        if self.config.render:
            obs["image"] = self.render()  # raises once closed, rather than dropping the image
            if len(self._cameras) > 1:
                rest = [self.render(v) for v in range(1, len(self._cameras))]
                obs["views"] = np.stack([obs["image"], *rest])
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode; ``seed`` fixes the object/goal positions (same seed, same episode).

        Without a seed the first reset uses the constructor's ``seed`` and later ones continue
        the same random stream, as in gymnasium.
        """
        if seed is None and not self._seeded and self.config.seed is not None:
            seed = self.config.seed
        super().reset(seed=seed)  # (re)seeds self.np_random when seed is given
        self._seeded = self._seeded or seed is not None
        self.episode_seed = seed
        # Meta-World draws the episode's positions from its env's np_random in reset_model().
        self._mw.np_random = self.np_random
        raw, _ = self._mw.reset()
        # Meta-World's reset moves the goal marker (model.site_pos) after its last forward pass,
        # so the reset frame drew the marker where the previous episode had it: an image that
        # lies about the goal (every reach / push / pick-place episode's first frame until
        # 2026-12-05). Kinematics alone updates the drawn positions and leaves the physics
        # (warm starts, contacts) bitwise as it was.
        mujoco.mj_kinematics(self._mw.model, self._mw.data)
        self._raw_obs = raw
        self._steps = 0
        return self._obs(), {"success": False, "seed": seed, "task_vector": self.task_vector}

    def step(
        self, action: np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply one action; ``terminated`` = success, ``truncated`` = step limit reached."""
        if self._raw_obs is None:
            raise RuntimeError("call reset() before step()")
        if self._steps >= self.max_steps:
            raise RuntimeError(f"episode already ran its {self.max_steps} steps; call reset()")
        act = np.asarray(action, dtype=np.float32).reshape(-1)
        if act.shape != (4,) or not np.all(np.isfinite(act)):
            raise ValueError(f"action must be 4 finite numbers, got {action!r}")
        # Meta-World clips xyz itself but passes the gripper effort straight to the actuators.
        act = np.clip(act, -1.0, 1.0)
        raw, reward, _, _, mw_info = self._mw.step(act)
        self._raw_obs = raw
        self._steps += 1
        success = bool(mw_info["success"])
        info = {**mw_info, "success": success, "steps": self._steps}
        return self._obs(), float(reward), success, self._steps >= self.max_steps, info

    # -- simulator state (demonstrations stored as states, rendered where they are needed) ---

    def sim_state(self) -> np.ndarray:
        """float32 (qpos, qvel, mocap pos, mocap quat) of the current frame, flattened.

        With the episode's seed this is all a frame is made of: :meth:`restore` of it after
        ``reset(seed=...)`` renders the same pixels (float32 is < 1e-7 m of rounding) and the
        same observation, so demonstrations are kept as ~0.2 KB per frame instead of ~100 KB."""
        d = self._mw.data
        return np.concatenate(
            (d.qpos, d.qvel, d.mocap_pos.reshape(-1), d.mocap_quat.reshape(-1))
        ).astype(np.float32)

    def restore(self, state: np.ndarray) -> dict[str, np.ndarray]:
        """Put the simulator in ``state`` (from :meth:`sim_state`, same episode seed) and
        return that frame's observation; the episode's goal stays the one ``reset`` drew."""
        m, d = self._mw.model, self._mw.data
        sizes = (m.nq, m.nv, 3 * m.nmocap, 4 * m.nmocap)
        if state.shape != (sum(sizes),):
            raise ValueError(f"a {self.task.name} state has {sum(sizes)} values, got {state.shape}")
        qpos, qvel, mpos, mquat = np.split(state.astype(np.float64), np.cumsum(sizes)[:-1])
        d.qpos[:], d.qvel[:] = qpos, qvel
        d.mocap_pos[:], d.mocap_quat[:] = mpos.reshape(-1, 3), mquat.reshape(-1, 4)
        mujoco.mj_forward(m, d)
        raw = np.array(self.raw_obs, dtype=np.float64)
        curr = self._mw._get_curr_obs_combined_no_goal()  # hand, gripper, objects (18 values)
        raw[: len(curr)] = curr  # not _get_obs(): that would advance the frame-stack buffer
        self._raw_obs = raw
        return self._obs()

    @property
    def steps(self) -> int:
        """Steps taken in the current episode."""
        return self._steps

    @property
    def raw_obs(self) -> np.ndarray:
        """Meta-World's last 39-d observation (goal entries zeroed)."""
        if self._raw_obs is None:
            raise RuntimeError("call reset() first")
        return self._raw_obs

    @property
    def targets(self) -> np.ndarray:
        """float32 (6,): the first object's xyz and the goal's xyz (metres), from the simulator
        state. A training-only signal (an auxiliary head regresses them from the pixels); never
        part of a policy's input, which sees objects and goals only through the cameras."""
        goal = np.asarray(self._mw._get_pos_goal(), dtype=np.float32).reshape(-1)[:3]
        return np.concatenate((self.raw_obs[4:7].astype(np.float32), goal))

    @property
    def task_vector(self) -> list[float]:
        """This episode's sampled Meta-World task vector (object and goal positions)."""
        vec = self._mw._last_rand_vec
        return [] if vec is None else [float(v) for v in vec]

    def expert_action(self, raw_obs: np.ndarray | None = None) -> np.ndarray:
        """The scripted Meta-World policy's action for ``raw_obs`` (default: the current one).

        The experts read the goal from the last 3 observation entries, which Meta-World zeroes
        here, so the true goal (``_get_pos_goal()``, what the full observation would carry) is
        put back first. ``_get_obs()`` is not called for it: that would also advance Meta-World's
        frame-stacking buffer.
        """
        full = np.array(self.raw_obs if raw_obs is None else raw_obs, dtype=np.float64)
        full[-3:] = self._mw._get_pos_goal()
        if self._policy is None:
            self._policy = self.task.expert_policy()
        with warnings.catch_warnings():
            # The experts use gains that exceed the action range on purpose; they warn every step.
            warnings.filterwarnings("ignore", message="Constant\\(s\\) may be too high")
            action = self._policy.get_action(full)
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)

    @staticmethod
    def hold_action(last: np.ndarray | None = None) -> np.ndarray:
        """The action of a robot that holds still while it waits for a chunk: no end-effector
        motion (the xyz delta is 0), the gripper keeping the effort ``last`` gave it (an
        object held stays held), open (-1) before any action."""
        grip = -1.0 if last is None else float(np.asarray(last).reshape(-1)[3])
        return np.array([0.0, 0.0, 0.0, grip], dtype=np.float32)

    def close(self) -> None:
        """Free the GL context (safe to call twice)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        _OPEN_ENVS.discard(self)
        self._mw.close()
