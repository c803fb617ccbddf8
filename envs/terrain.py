"""Tiled rough terrain for legged robots: the height field, the tiles' layout, and height lookups on the device.

The layout is legged_gym's (`legged_gym/utils/terrain.py`): a grid of square tiles, one row per difficulty level
and one column per terrain type, inside a flat border. Each tile is made by the Isaac Gym terrain generators that
Genesis ships (`genesis.ext.isaacgym.terrain_utils`), with legged_gym's difficulty scaling (difficulty = level /
levels, so level 0 is the easiest and the top level is 0.9 of the hardest):

    flat         flat ground
    slope_up     a pyramid pit, slope 0.4 * difficulty (robots start on the flat bottom and walk up)
    slope_down   a pyramid hill, slope 0.4 * difficulty (they start on the flat top and walk down)
    rough        the hill above with uniform noise of +-0.05 m on a 0.2 m grid (legged_gym's "rough slope")
    stairs_up    pyramid stairs into a pit, steps 0.31 m deep and 0.05 + 0.18 * difficulty m high
    stairs_down  pyramid stairs on a hill, the same steps
    obstacles    20 rectangles 1-2 m wide, 0.05 + 0.2 * difficulty m up or down

Every tile but flat has a 3 m flat platform at its centre, where robots are spawned. `HeightField` answers "how
high is the ground at these (x, y)" for a whole batch of points at once, on the simulation device, with the same
triangles Genesis collides with, so a height scan sees exactly the surface the feet touch.
"""

from __future__ import annotations

import numpy as np
import torch

TERRAIN_TYPES = ("flat", "slope_up", "slope_down", "rough", "stairs_up", "stairs_down", "obstacles")
PLATFORM_M = 3.0  # flat centre of each tile (legged_gym's platform_size)


def tile_height_field(kind: str, difficulty: float, cells: int, horizontal_scale: float,
                      vertical_scale: float) -> np.ndarray:
    """One tile's heights in units of `vertical_scale`, `cells` x `cells`, from the generators Genesis ships
    (which draw from NumPy's global generator: the caller seeds it)."""
    from genesis.ext.isaacgym import terrain_utils

    tile = terrain_utils.SubTerrain(width=cells, length=cells, vertical_scale=vertical_scale,
                                    horizontal_scale=horizontal_scale)
    slope = 0.4 * difficulty
    step_height = 0.05 + 0.18 * difficulty
    if kind == "flat":
        pass
    elif kind in ("slope_up", "slope_down", "rough"):
        terrain_utils.pyramid_sloped_terrain(tile, slope=-slope if kind == "slope_up" else slope,
                                             platform_size=PLATFORM_M)
        if kind == "rough":
            terrain_utils.random_uniform_terrain(tile, min_height=-0.05, max_height=0.05, step=0.005,
                                                 downsampled_scale=0.2)
    elif kind in ("stairs_up", "stairs_down"):
        terrain_utils.pyramid_stairs_terrain(tile, step_width=0.31,
                                             step_height=-step_height if kind == "stairs_up" else step_height,
                                             platform_size=PLATFORM_M)
    elif kind == "obstacles":
        terrain_utils.discrete_obstacles_terrain(tile, max_height=0.05 + 0.2 * difficulty, min_size=1.0,
                                                 max_size=2.0, num_rects=20, platform_size=PLATFORM_M)
    else:
        raise ValueError(f"unknown terrain type {kind!r}; the types are {', '.join(TERRAIN_TYPES)}")
    return tile.height_field_raw


class TileLayout:
    """Where each tile lies: `levels` rows along x (difficulty), one column per type along y, inside a flat
    border `border` metres wide; a tile is `tile_size` metres square, `cells` grid points of `horizontal_scale`."""

    def __init__(self, levels: int, types: tuple[str, ...], tile_size: float, border: float, horizontal_scale: float):
        for kind in types:
            if kind not in TERRAIN_TYPES:
                raise ValueError(f"unknown terrain type {kind!r}; the types are {', '.join(TERRAIN_TYPES)}")
        if not types:
            raise ValueError("terrain_types must name at least one terrain type")
        if not isinstance(levels, int) or levels < 1:
            raise ValueError(f"terrain_levels must be a positive integer, got {levels!r}")
        cells = round(tile_size / horizontal_scale)
        if cells < 2 or abs(cells * horizontal_scale - tile_size) > 1e-6:
            raise ValueError(f"tile_size ({tile_size}) must be a multiple (2 or more) of horizontal_scale "
                             f"({horizontal_scale})")
        self.levels, self.types, self.cells = levels, tuple(types), cells
        self.border_cells = round(border / horizontal_scale)
        self.horizontal_scale = horizontal_scale
        self.tile_size = cells * horizontal_scale

    @property
    def shape(self) -> tuple[int, int]:
        """The height field's grid points along x and y."""
        b = 2 * self.border_cells
        return self.levels * self.cells + b, len(self.types) * self.cells + b

    def tile_centres(self) -> np.ndarray:
        """(levels, types, 2): the (x, y) centre of every tile, metres, with the field's first point at (0, 0)."""
        h, b, c = self.horizontal_scale, self.border_cells, self.cells
        x = (b + (np.arange(self.levels) + 0.5) * c) * h
        y = (b + (np.arange(len(self.types)) + 0.5) * c) * h
        return np.stack(np.meshgrid(x, y, indexing="ij"), axis=-1)

    def height_field(self, vertical_scale: float, seed: int) -> np.ndarray:
        """The whole field in units of `vertical_scale` (what `gs.morphs.Terrain(height_field=...)` takes).
        The same seed gives the same field (Genesis then loads its collision data from its cache)."""
        field = np.zeros(self.shape, dtype=np.float32)
        saved = np.random.get_state()
        np.random.seed(seed)
        try:
            b, c = self.border_cells, self.cells
            for level in range(self.levels):
                for column, kind in enumerate(self.types):
                    tile = tile_height_field(kind, level / self.levels, c, self.horizontal_scale, vertical_scale)
                    field[b + level * c:b + (level + 1) * c, b + column * c:b + (column + 1) * c] = tile
        finally:
            np.random.set_state(saved)
        return field


class HeightField:
    """Ground heights (metres) at batches of (x, y) points, on the device of `heights`.

    `heights[i, j]` is the ground at (x0 + i * h, y0 + j * h). Between grid points the surface is the one Genesis
    builds from a height field (`convert_heightfield_to_watertight_trimesh`): each cell split into two triangles
    along its (i+1, j)-(i, j+1) diagonal, heights linear on each. Points outside the field read its nearest edge.
    """

    def __init__(self, heights: torch.Tensor, horizontal_scale: float, origin: tuple[float, float] = (0.0, 0.0)):
        self.heights = heights
        self.horizontal_scale = horizontal_scale
        self.origin = torch.tensor(origin, dtype=heights.dtype, device=heights.device)
        # A cell's corners (i, j), (i+1, j), (i, j+1), (i+1, j+1) as offsets in the flattened grid: one gather reads
        # all four (four indexings are a dozen small ops, kernels on a GPU; the scan reads 187 points per robot)
        cols = heights.shape[1]
        self.corner_offsets = torch.tensor([0, cols, 1, cols + 1], device=heights.device)

    def height_at(self, xy: torch.Tensor) -> torch.Tensor:
        """xy: (..., 2) world coordinates; returns (...) heights."""
        rows, cols = self.heights.shape
        grid = (xy - self.origin) / self.horizontal_scale
        gx = grid[..., 0].clamp(0.0, rows - 1.0)
        gy = grid[..., 1].clamp(0.0, cols - 1.0)
        i = gx.floor().long().clamp(max=rows - 2)
        j = gy.floor().long().clamp(max=cols - 2)
        u, v = gx - i, gy - j
        corners = self.heights.view(-1)[(i * cols + j)[..., None] + self.corner_offsets]
        h00, h10, h01, h11 = corners.unbind(-1)
        lower = h00 + u * (h10 - h00) + v * (h01 - h00)  # triangle (i, j), (i+1, j), (i, j+1)
        upper = h11 + (1 - u) * (h01 - h11) + (1 - v) * (h10 - h11)  # triangle (i+1, j+1), (i, j+1), (i+1, j)
        return torch.where(u + v <= 1.0, lower, upper)


def scan_grid(length_x: float, width_y: float, spacing: float) -> torch.Tensor:
    """(points, 2): a rectangular grid of scan points centred on the robot, in its yaw frame (x forward),
    `spacing` apart, x-major (legged_gym's measured_points_x/_y order)."""
    nx, ny = round(length_x / spacing) + 1, round(width_y / spacing) + 1
    x = torch.linspace(-length_x / 2, length_x / 2, nx)
    y = torch.linspace(-width_y / 2, width_y / 2, ny)
    return torch.stack(torch.meshgrid(x, y, indexing="ij"), dim=-1).reshape(-1, 2)


def yaw_of(quat: torch.Tensor) -> torch.Tensor:
    """The heading (rotation about world z) of (w, x, y, z) quaternions (Genesis's order)."""
    w, x, y, z = quat.unbind(-1)
    return torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def scan_points_world(base_xy: torch.Tensor, yaw: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """(envs, points, 2): the scan grid `points` (yaw frame) rotated by each robot's heading and placed at its base."""
    cos, sin = torch.cos(yaw)[:, None], torch.sin(yaw)[:, None]
    px, py = points[:, 0][None], points[:, 1][None]
    return torch.stack((base_xy[:, :1] + cos * px - sin * py, base_xy[:, 1:] + sin * px + cos * py), dim=-1)
