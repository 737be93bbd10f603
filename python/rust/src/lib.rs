//! `shufflefs._native`: the in-process backend of the `shufflefs` Python package.
//!
//! One class, `View`: a dataset opened through a plan, reading step files' rows straight into
//! a caller's writable buffer (a numpy array, pinned host memory) with the GIL released. The
//! Python side (`shufflefs.Dataset`) wraps it; nothing here is meant to be used directly.
//!
//! Only `core.rs` names the shufflefs library's API; this file is the pyo3 glue.

mod core;

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::core::{Core, CoreError};

fn py_err(e: CoreError) -> PyErr {
    match e {
        CoreError::Invalid(m) => PyValueError::new_err(m),
        CoreError::Io(m) => PyOSError::new_err(m),
    }
}

/// A dataset seen through a plan, read in this process (no FUSE).
#[pyclass(frozen, module = "shufflefs._native")]
struct View {
    core: Core,
}

#[pymethods]
impl View {
    /// Opens the dataset directory `path` with the plan given as mount flags, e.g.
    /// `["--window", "2049", "--stride", "2048", "--batch-size", "8"]`.
    #[new]
    fn new(py: Python<'_>, path: PathBuf, flags: Vec<String>) -> PyResult<View> {
        let core = py.detach(|| Core::open(&path, &flags)).map_err(py_err)?;
        Ok(View { core })
    }

    /// The bytes of `info.json`, as the mount serves them.
    fn info_json<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.core.info_json())
    }

    /// Size of the `.npy` header of every step file.
    #[getter]
    fn header_bytes(&self) -> u64 {
        self.core.header_bytes()
    }

    /// Size of a step file's rows (the file without its header).
    #[getter]
    fn data_bytes(&self) -> u64 {
        self.core.data_bytes()
    }

    /// Reads the rows of `epoch/E/rank/R/step/S.npy` into `out`, a writable C-contiguous
    /// buffer of exactly the step's rows (`data_bytes` at the plan's batch size), with the GIL
    /// released.
    fn read_step(
        &self,
        py: Python<'_>,
        epoch: u64,
        rank: u64,
        step: u64,
        out: PyBuffer<u8>,
    ) -> PyResult<()> {
        if out.readonly() {
            return Err(PyValueError::new_err("the output buffer is read-only"));
        }
        if !out.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "the output buffer must be C-contiguous",
            ));
        }
        let (ptr, len) = (out.buf_ptr() as usize, out.len_bytes());
        py.detach(|| {
            // SAFETY: `out` holds a buffer export of a writable, C-contiguous object of `len`
            // bytes at `ptr` for the whole call (it is dropped after this closure returns), so
            // the memory stays allocated and cannot be resized. Other Python threads may run
            // while the GIL is released; as with `readinto`, a thread that touches the same
            // buffer concurrently sees unspecified bytes, but no memory is freed or moved.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            self.core.read_step(epoch, rank, step, buf)
        })
        .map_err(py_err)
    }

    /// The bytes of `epoch/E/rank/R/step/S.json`.
    fn step_json<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        rank: u64,
        step: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py
            .detach(|| self.core.step_json(epoch, rank, step))
            .map_err(py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<View>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
