"""Questions over ``inference_docs/`` (8 essays written for this benchmark on running language models locally:
prefill and decode, the KV cache and its quantization, prefix caching, continuous batching and chunked prefill,
speculative decoding, GGUF quantization formats, sampling, measuring latency).

Technical prose dense with exact terms that recur across the essays (prefill, KV cache, q8_0, slots, TTFT,
temperature), so most questions have a near-miss in another essay: q8_0 is described in the KV cache essay and
in the formats essay, stalls in the batching essay and in the latency essay, high temperature in the sampling
and speculative essays, blocks in the KV cache and prefix caching essays.

Each entry: ``(question, document file, answer)`` where ``answer`` is a short phrase copied from the one
passage that answers the question (judged as in ``everyday_questions``). The questions were written after the
essays and before any retrieval was run on them, and were not changed afterwards: about half paraphrase the
passage ("why does generating not get faster with more cores" for "adding more threads only adds contention"),
about a third name an exact term (n_ubatch, --draft-p-min, repeat_last_n, goodput).
"""

QUESTIONS: list[tuple[str, str, str]] = [
    # prefill_and_decode.md
    ("why doesn't text generation get any faster when I give it more CPU cores?", "prefill_and_decode.md",
     "adding more threads only adds contention"),
    ("what is the difference between n_batch and n_ubatch", "prefill_and_decode.md",
     "the physical micro-batch size (n_ubatch)"),
    ("how fast could an 8B model possibly generate on a desktop with DDR5 memory", "prefill_and_decode.md",
     "cannot decode faster than about 16 tokens per second"),
    ("model barely fits in VRAM: put some layers on the CPU or make the context smaller?",
     "prefill_and_decode.md", "shrinking the context or quantizing the KV cache"),
    ("I paste a long document and wait ages before the first word, then it types fast. What helps?",
     "prefill_and_decode.md", "a shorter prompt, a cached prefix, or a GPU"),
    # kv_cache_memory.md
    ("how much KV cache memory per token for a model with 32 layers and 8 KV heads at f16", "kv_cache_memory.md",
     "exactly 128 KiB per token"),
    ("which is more sensitive to quantization, type_k or type_v?", "kv_cache_memory.md",
     "q4_0 keys cost noticeably more quality than q4_0 values"),
    ("context creation fails when I set --cache-type-v to q4_0", "kv_cache_memory.md",
     "a quantized V cache requires flash attention"),
    ("with a 16K context and four parallel slots, how long can each conversation be?", "kv_cache_memory.md",
     "each conversation gets 4,096 positions"),
    ("how much does grouped-query attention save compared to ordinary multi-head attention",
     "kv_cache_memory.md", "stores a quarter of the cache"),
    ("how big is each block in vLLM's PagedAttention", "kv_cache_memory.md", "16 tokens each by default"),
    # prefix_caching.md
    ("why is it bad to put today's date at the top of the system prompt", "prefix_caching.md",
     "defeats the cache every day at midnight"),
    ("is the cached work reused if the same passage shows up at a different spot in the prompt?",
     "prefix_caching.md", "does not reuse a document that moves around"),
    ("how are the block hashes chained in vLLM prefix caching", "prefix_caching.md",
     "the hash of the block before it"),
    ("why would a multi-user server mix a salt into the cache key", "prefix_caching.md",
     "detectable by another through timing"),
    ("can I keep the cached prompt after the program is closed and opened again?", "prefix_caching.md",
     "to a file and read it back later"),
    ("does reusing a cached prefix make the tokens come out faster too, or only the start?",
     "prefix_caching.md", "Decode speed is unchanged, because the generated tokens are new"),
    # batching_and_chunked_prefill.md
    ("what is iteration-level scheduling", "batching_and_chunked_prefill.md",
     "makes the decision at every step instead of every batch"),
    ("what does the -np flag of llama-server set", "batching_and_chunked_prefill.md",
     "sets the number of slots, each an independent conversation state"),
    ("downside of splitting a long prompt into smaller pieces per step", "batching_and_chunked_prefill.md",
     "the newcomer's time to first token grows"),
    ("the server ran out of memory halfway through generating for lots of users, which request gets kicked out?",
     "batching_and_chunked_prefill.md", "vLLM preempts the most recently admitted sequence first"),
    ("what does the scheduler do wrong when one user's huge prompt freezes everyone else's output",
     "batching_and_chunked_prefill.md", "This effect is called a generation stall"),
    # speculative_decoding.md
    ("expected tokens per pass with acceptance rate 0.8 and 4 drafted tokens", "speculative_decoding.md",
     "about 3.36 tokens per pass"),
    ("does letting a small model guess ahead change what the big model would have written?",
     "speculative_decoding.md", "a pure speed optimisation, not an approximation"),
    ("what does --draft-p-min do", "speculative_decoding.md", "falls below a threshold (--draft-p-min)"),
    ("speed up generation without loading a second model when the reply mostly copies from my input",
     "speculative_decoding.md", "Prompt lookup decoding, also called n-gram drafting"),
    ("can the draft model use a different tokenizer from the main one?", "speculative_decoding.md",
     "must share the target's vocabulary"),
    ("why doesn't guessing ahead with a draft model help much when writing fiction",
     "speculative_decoding.md", "Free-form creative text at high temperature accepts poorly"),
    # quantization_formats.md
    ("what does the M at the end of Q4_K_M mean", "quantization_formats.md", "The suffix names a recipe"),
    ("how many bits per weight does Q8_0 use", "quantization_formats.md", "which works out to 8.5 bits per weight"),
    ("how is an imatrix made", "quantization_formats.md",
     "measured by running the full-precision model over a calibration text"),
    ("bigger model squeezed hard or smaller model at near full precision, which is better?",
     "quantization_formats.md", "larger model at moderate quantization usually beats"),
    ("a better way than perplexity to see how far a compressed model drifts from the original",
     "quantization_formats.md", "compares the quantized model's token distributions to the original's"),
    # sampling.md
    ("how does min_p decide which tokens to keep", "sampling.md",
     "min_p times the probability of the most likely token"),
    ("same temperature and top_p in two apps give different text from the same model, why", "sampling.md",
     "their order changes the result"),
    ("I set a fixed seed but get different output when the server is busy with other requests", "sampling.md",
     "can depend on the batch size, the number of threads"),
    ("default repeat_last_n in llama.cpp", "sampling.md", "repeat_last_n, 64 by default"),
    ("good settings for answering questions from my own documents", "sampling.md",
     "temperature 0.2, top_p 0.95, min_p 0.05, no penalties"),
    # measuring_latency.md
    ("what is goodput", "measuring_latency.md",
     "counting only the requests that met the service-level objectives"),
    ("difference between TPOT and ITL", "measuring_latency.md", "TPOT is one number per request"),
    ("why does a benchmark with a fixed number of clients hide the slowdowns", "measuring_latency.md",
     "known as coordinated omission"),
    ("how many requests before the 99th percentile means anything", "measuring_latency.md",
     "P99 from 100 requests is essentially the single worst request"),
    ("should the first request after loading the model count in the results?", "measuring_latency.md",
     "Benchmarks should discard a warm-up phase"),
]
