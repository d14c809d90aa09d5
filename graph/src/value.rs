//! A concrete tensor value: where its data lives. A value made on the host (`Tensor::from_slice`) has a
//! host copy; a value a device computed lives in a device buffer and gets a host copy only when read.
//! A host value used on a device is uploaded once and the device copy kept with it, so a weight read by
//! every call of a compiled function crosses to the device once.

use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::{DeviceTensor, Runtime};
use crate::shape::Shape;
use crate::TensorData;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// A concrete value: a host copy, a device copy, or both.
pub struct Value {
    dtype: DType,
    dims: Vec<usize>,
    host: OnceLock<Arc<TensorData>>,
    /// Set once (a value's data never changes): read on every call without a lock.
    device: OnceLock<DeviceTensor>,
    /// The upload that replaces `device` once the device it lived on was lost and opened again.
    renewed: std::sync::Mutex<Option<DeviceTensor>>,
}

impl Value {
    /// A value held on the host.
    pub fn from_host(data: Arc<TensorData>) -> Arc<Value> {
        let v = Value {
            dtype: data.dtype(),
            dims: data.dims().to_vec(),
            host: OnceLock::new(),
            device: OnceLock::new(),
            renewed: Default::default(),
        };
        let _ = v.host.set(data);
        Arc::new(v)
    }

    /// A value that lives on a device.
    pub fn from_device(t: DeviceTensor) -> Arc<Value> {
        Arc::new(Value {
            dtype: t.dtype,
            dims: t.dims.to_vec(),
            host: OnceLock::new(),
            device: OnceLock::from(t),
            renewed: Default::default(),
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dims.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The shape as constant dims.
    pub fn shape(&self) -> Shape {
        Shape::from_dims(&self.dims)
    }

    /// The host copy, if there is one yet.
    pub fn host_if_present(&self) -> Option<&Arc<TensorData>> {
        self.host.get()
    }

    /// The device copy, if there is one.
    pub fn device(&self) -> Option<DeviceTensor> {
        self.device.get().cloned()
    }

    /// The name of the device the value lives on (`None`: host only).
    pub fn device_name(&self) -> Option<&'static str> {
        self.device.get().map(|t| t.buffer.runtime().name())
    }

    /// The data on the host: the host copy, or the device copy read back (waits for it) and kept.
    pub fn to_host(&self) -> Result<Arc<TensorData>> {
        if let Some(h) = self.host.get() {
            return Ok(h.clone());
        }
        let t = self.device().expect("a value without a host copy has a device copy");
        let data = Arc::new(t.buffer.runtime().download(&t)?);
        Ok(self.host.get_or_init(|| data).clone())
    }

    /// [`Value::to_host`] without blocking.
    pub async fn to_host_async(&self) -> Result<Arc<TensorData>> {
        if let Some(h) = self.host.get() {
            return Ok(h.clone());
        }
        let t = self.device().expect("a value without a host copy has a device copy");
        let data = Arc::new(t.buffer.runtime().download_async(&t).await?);
        Ok(self.host.get_or_init(|| data).clone())
    }

    /// Every one of `values` on `rt` ([`Value::on`]), after `rt` opened its device again if it was lost:
    /// a weight whose device copy went with a lost device is then seen as stale and uploaded again.
    pub fn all_on<'a>(values: &'a [Arc<Value>], rt: &Arc<Runtime>) -> Result<Vec<Cow<'a, DeviceTensor>>> {
        rt.reopen_if_lost()?;
        values.iter().map(|v| v.on(rt)).collect()
    }

    /// The value on `rt`: bound in place when it lives there, else uploaded — and the upload kept when the
    /// value has no device copy yet (weights cross once).
    pub fn on(&self, rt: &Arc<Runtime>) -> Result<Cow<'_, DeviceTensor>> {
        let dev = self.device.get();
        if let Some(t) = dev.filter(|t| Arc::ptr_eq(t.buffer.runtime(), rt)) {
            if t.buffer.is_live() {
                return Ok(Cow::Borrowed(t));
            }
            // Its device was lost and opened again: a value with a host copy (a weight) is uploaded
            // again, once; one that lived only there is gone (reading it says so).
            let host = match self.host.get() {
                Some(h) => h.clone(),
                None => return t.buffer.live("a tensor").map(|()| Cow::Borrowed(t)),
            };
            let mut renewed = crate::runtime::lock(&self.renewed);
            if let Some(r) = renewed.as_ref().filter(|r| r.buffer.is_live()) {
                return Ok(Cow::Owned(r.clone()));
            }
            let fresh = rt.upload(&host)?;
            *renewed = Some(fresh.clone());
            return Ok(Cow::Owned(fresh));
        }
        let host = match dev {
            Some(_) => self.to_host()?,
            None => self.host.get().expect("a value has a host or a device copy").clone(),
        };
        let t = rt.upload(&host)?;
        // Another thread may have uploaded it meanwhile: then its copy is the value's, and this one serves
        // only this call.
        match self.device.set(t) {
            Ok(()) => Ok(Cow::Borrowed(self.device.get().expect("just set"))),
            Err(t) => Ok(Cow::Owned(t)),
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.host.get(), self.device_name()) {
            (Some(h), _) => write!(f, "{} {}, {:?}", self.dtype, self.shape(), h.values()),
            (None, Some(d)) => write!(f, "{} {} on {d}", self.dtype, self.shape()),
            (None, None) => write!(f, "{} {}", self.dtype, self.shape()),
        }
    }
}
