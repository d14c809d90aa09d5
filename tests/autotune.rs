//! `Mode::MaxAutotune` as a user runs it: a function with a matmul template and row reductions compiled
//! in max-autotune mode gives the reference's answers, spends its tuning time timing candidate schedules
//! on the device (reported in the compile stats), and a second compile with the same cache directory
//! takes the tuned schedules from the tuning cache without timing anything. On wgpu (lavapipe in CI,
//! whose timestamp queries time each launch). Its own test binary: it sets `KILN_CACHE_DIR`.

mod common;

use kiln::{compile, Backend, DType, Mode, Tensor, TensorData};

fn inputs() -> Vec<Tensor> {
    let t = |dims: &[usize], seed: usize| {
        let n: usize = dims.iter().product();
        let v = (0..n).map(|i| (((i * 7 + seed * 13) % 29) as f64 - 14.0) / 9.0).collect();
        Tensor::from_data(TensorData::from_f64(v, dims, DType::F32).unwrap())
    };
    vec![t(&[300, 96], 1), t(&[160, 96], 2), t(&[160], 3)]
}

fn model(x: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    let h = x[0].linear(&x[1], Some(&x[2]))?.relu()?;
    Ok(vec![h.softmax(-1)?, h.sum(&[0], false)?])
}

#[test]
fn max_autotune_times_candidates_once_and_then_reads_its_cache() {
    if common::wgpu_skipped() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("KILN_CACHE_DIR", &dir);
    let want: Vec<Tensor> = compile(|x: Vec<Tensor>| model(&x)).backend(Backend::Cpu).call(inputs()).unwrap();
    let rt = Backend::Wgpu.runtime().unwrap().expect("wgpu has a runtime");
    let timed = rt.timing() != "host wall time";
    for round in 0..2 {
        let f = compile(|x: Vec<Tensor>| model(&x)).backend(Backend::Wgpu).mode(Mode::MaxAutotune);
        let got: Vec<Tensor> = f.call(inputs()).unwrap();
        for (g, w) in got.iter().zip(&want) {
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            assert!(g.iter().zip(&w).all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1.0)), "round {round}");
        }
        // A second call runs the tuned entry: no more tuning.
        let again: Vec<Tensor> = f.call(inputs()).unwrap();
        assert_eq!(again[0].to_vec::<f32>().unwrap(), got[0].to_vec::<f32>().unwrap());
        let s = f.stats();
        eprintln!(
            "round {round}: {} kernels timed, tuning {:.1} ms of {:.1} ms traced",
            s.tuned_kernels, s.tuning_ms, s.trace_ms
        );
        assert_eq!((s.traces, s.calls), (1, 2), "{s:?}");
        if round == 0 && timed {
            assert!(s.tuned_kernels >= 2, "the matmul and the reductions timed: {s:?}");
            assert!(s.tuning_ms > 0.0 && s.tuning_ms <= s.trace_ms, "{s:?}");
            assert!(dir.join("tuning.json").is_file());
        }
        if round == 1 {
            assert_eq!(s.tuned_kernels, 0, "the second compile reads the tuning cache: {s:?}");
        }
        if !timed {
            eprintln!("{}: no device timing, default schedules kept", rt.timing());
            assert_eq!(s.tuned_kernels, 0);
        }
    }
    // A corrupt tuning cache costs a re-tune, never an error.
    std::fs::write(dir.join("tuning.json"), "{ not json").unwrap();
    let f = compile(|x: Vec<Tensor>| model(&x)).backend(Backend::Wgpu).mode(Mode::MaxAutotune);
    let _: Vec<Tensor> = f.call(inputs()).unwrap();
    if timed {
        assert!(f.stats().tuned_kernels >= 2, "{:?}", f.stats());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
