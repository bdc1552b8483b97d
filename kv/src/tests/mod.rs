//! Tests beside the code: data-driven scenarios, a model-based property test, checkpoint round
//! trips and damage, and a concurrency test.

mod checkpoint;
mod concurrency;
mod delta;
mod model;
mod on_disk;
mod scenario;
mod space;
mod split;
