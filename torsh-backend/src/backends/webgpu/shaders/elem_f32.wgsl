// The stored element type of `elementwise.wgsl` for f32 tensors: values load and store as they are.

alias elem = f32;

fn load_elem(v: elem) -> f32 {
    return v;
}

fn store_elem(v: f32) -> elem {
    return v;
}

