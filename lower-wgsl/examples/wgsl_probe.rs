//! Times hand-edited variants of one elementwise WGSL kernel on the default adapter, to try a codegen
//! change on a real driver before making it in the renderer:
//! `cargo run --release -p kiln-wgsl --example wgsl_probe -- N GROUPS a.wgsl b.wgsl …`.
//!
//! Every storage binding a shader declares gets a buffer of N f32 (the same values, uniform in [-4, 4]:
//! enough for any binding of a kernel whose largest operand has N elements); entry point `main`,
//! dispatched as GROUPS workgroups (folded over x and y). The last binding is the one compared. Device time comes from timestamp queries
//! around ten dispatches in one pass, the median of 20 such samples; each output is compared with the
//! first shader's (max |difference|). Shaders compile with the runtime's checks
//! (`KILN_WGPU_SHADER_CHECKS`, `kiln_wgsl::shader_checks`).

use kiln_wgsl::shader_checks::ShaderChecks;
use wgpu::util::DeviceExt;

const SAMPLES: usize = 20;
const BATCH: u32 = 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: wgsl_probe N GROUPS shader.wgsl...");
        std::process::exit(2);
    }
    let n: u64 = args[1].parse().expect("N: a count of f32 elements");
    let groups: u32 = args[2].parse().expect("GROUPS: a count of workgroups");
    pollster::block_on(run(n, groups, &args[3..]));
}

async fn run(n: u64, groups: u32, files: &[String]) {
    let adapters = kiln_wgsl::adapters::find().await;
    let adapter = adapters[kiln_wgsl::adapters::default_index(&adapters).expect("an adapter")].clone();
    println!("adapter: {}", adapter.get_info().name);
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: None,
            required_features: wgpu::Features::TIMESTAMP_QUERY | (adapter.features() & wgpu::Features::SUBGROUP),
            required_limits: adapter.limits(),
            ..Default::default()
        })
        .await
        .expect("a device with timestamp queries");
    let input: Vec<f32> = (0..n).map(|i| ((i.wrapping_mul(2654435761) % 8001) as f32 / 1000.0) - 4.0).collect();
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: n * 4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let queries =
        device.create_query_set(&wgpu::QuerySetDescriptor { label: None, ty: wgpu::QueryType::Timestamp, count: 2 });
    let resolved = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let stamps = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let period = f64::from(queue.get_timestamp_period());
    let checks = ShaderChecks::from_env().expect("KILN_WGPU_SHADER_CHECKS");
    println!("checks: {checks:?}");
    let (x, y) = if groups > 65_535 { (65_535, groups.div_ceil(65_535)) } else { (groups, 1) };
    let mut first: Option<Vec<f32>> = None;
    for file in files {
        let source = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        kiln_wgsl::validate(file, &source).unwrap_or_else(|e| panic!("{e}"));
        assert!(!source.contains("var<uniform>"), "{file}: symbol values (a uniform block) are not supported");
        let module = checks.module(&device, file, &source);
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(file),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: checks.compilation_options(),
            cache: None,
        });
        let bindings = source.matches("var<storage").count() as u32;
        let buffers: Vec<wgpu::Buffer> = (0..bindings)
            .map(|_| {
                device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: None,
                    contents: bytemuck_f32(&input),
                    usage,
                })
            })
            .collect();
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut times = Vec::new();
        for sample in 0..SAMPLES + 2 {
            let mut encoder = device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &queries,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
                });
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind, &[]);
                for _ in 0..BATCH {
                    pass.dispatch_workgroups(x, y, 1);
                }
            }
            encoder.resolve_query_set(&queries, 0..2, &resolved, 0);
            encoder.copy_buffer_to_buffer(&resolved, 0, &stamps, 0, 16);
            queue.submit([encoder.finish()]);
            let ticks = map_u64(&device, &stamps);
            if sample >= 2 {
                times.push((ticks[1] - ticks[0]) as f64 * period / 1e6 / f64::from(BATCH));
            }
        }
        times.sort_by(f64::total_cmp);
        let mut encoder = device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(buffers.last().expect("a binding"), 0, &read, 0, n * 4);
        queue.submit([encoder.finish()]);
        let out = map_f32(&device, &read);
        let diff = first.as_ref().map_or(0.0, |f| {
            f.iter()
                .zip(&out)
                .map(|(a, b)| if a.is_nan() && b.is_nan() { 0.0 } else { (a - b).abs() })
                .fold(0.0f32, f32::max)
        });
        let gbs = (n * 8) as f64 / (times[SAMPLES / 2] * 1e-3) / 1e9;
        println!(
            "{file}: median {:.4} ms (min {:.4}, max {:.4}), {gbs:.0} GB/s, max |diff| vs first {diff:e}",
            times[SAMPLES / 2],
            times[0],
            times[SAMPLES - 1]
        );
        first.get_or_insert(out);
    }
}

fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern of the slice's length is its bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn map_bytes(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Vec<u8> {
    let slice = buffer.slice(..);
    slice.map_async(wgpu::MapMode::Read, |r| r.expect("mapping a readback buffer"));
    device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).expect("the device");
    let bytes = slice.get_mapped_range().expect("a mapped buffer").to_vec();
    buffer.unmap();
    bytes
}

fn map_u64(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Vec<u64> {
    map_bytes(device, buffer).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

fn map_f32(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Vec<f32> {
    map_bytes(device, buffer).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}
