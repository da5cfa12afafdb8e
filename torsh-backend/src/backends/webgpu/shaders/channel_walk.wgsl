// Walking a channel of a contiguous [batch, channels, spatial] tensor (batch norm and its
// gradients): the channel's value j (j = image * s + position) is at (image * c + ch) * s + position.
// The offset, within the input, of the channel's element `j` of `count` (j = image * s + position):
// `walk.x` is the image, `walk.y` the position; `step` advances it by WG elements.
fn channel_at(walk: vec2<u32>, ch: u32, c: u32, s: u32) -> u32 {
    return (walk.x * c + ch) * s + walk.y;
}

// `walk` advanced by WG elements, given WG = step.x images and step.y positions (step.y < s).
fn advance(walk: vec2<u32>, step: vec2<u32>, s: u32) -> vec2<u32> {
    var next = walk + step;
    if (next.y >= s) {
        next = vec2<u32>(next.x + 1u, next.y - s);
    }
    return next;
}

