//! The communicator interface shared by every backend.

/// One rank's handle on the group of ranks running the same host program.
///
/// The methods that post collectives and point-to-point transfers are added with the
/// backends that implement them.
pub trait Communicator {
    /// This rank's index in the world, in `0..size()`; equal to its device id.
    fn rank(&self) -> usize;

    /// The number of ranks in the world.
    fn size(&self) -> usize;
}
