//! The CUDA tier's command-line contract on any machine: `--gpu-memory` never changes the tokens
//! and always says where the matrices run (on a machine without a usable GPU, or in a build
//! without `--features cuda`, why it stays on the CPU); `bench gpu` without the feature says how
//! to get it. The GPU itself is exercised on the GPU machine (scripts/gpu-device-run).
mod common;
use common::{ids, json, nectar, root};

#[test]
fn gpu_memory_keeps_the_tokens_and_says_where_the_model_runs() {
    let model = root().join("tests/fixtures/glm-tiny/glm5/model");
    let model = model.to_str().unwrap();
    let args = [
        "run",
        "--model",
        model,
        "--json",
        "--prompt-ids",
        "1,2,3,4,5",
        "--max-tokens",
        "16",
        "--no-usage-save",
    ];
    let (ok, cpu, err) = nectar(&args);
    assert!(ok, "{err}");
    let mut with_gpu = args.to_vec();
    with_gpu.extend(["--gpu-memory", "1G"]);
    let (ok, gpu, err) = nectar(&with_gpu);
    assert!(ok, "{err}");
    assert_eq!(ids(&json(&gpu)["tokens"]), ids(&json(&cpu)["tokens"]));
    let placed = err
        .lines()
        .any(|l| l.starts_with("GPU: ") && l.contains("in VRAM"));
    let fell_back = err.contains("--gpu-memory:") && err.contains("running on the CPU");
    assert!(placed || fell_back, "no placement line: {err}");
    #[cfg(not(feature = "cuda"))]
    assert!(err.contains("--features cuda"), "{err}");
}

#[test]
fn gpu_memory_refuses_a_bad_size() {
    let (ok, _, err) = nectar(&["run", "--gpu-memory", "lots", "--max-tokens", "1"]);
    assert!(!ok);
    assert!(err.contains("--gpu-memory"), "{err}");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn bench_gpu_without_the_feature_says_how_to_get_it() {
    let (ok, _, err) = nectar(&["bench", "gpu", "--quick"]);
    assert!(!ok);
    assert!(err.contains("--features cuda"), "{err}");
}
