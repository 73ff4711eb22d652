//! Slots of the `REQUESTS` per-CPU array (calls of the request-boundary function).

/// While lock calls count: in sampled mode only inside the windows.
pub const WHILE_COUNTING: u32 = 0;
/// While the recording counts at all: sampled mode keeps its request
/// probe in all along, so its estimates can be scaled by the requests.
pub const WHOLE_RECORDING: u32 = 1;
pub const SLOTS: u32 = 2;
