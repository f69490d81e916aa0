/* dlsym_x86_64.S - the exported dlsym of libprobe_intercept.so (x86-64 only).
 *
 * glibc resolves dlsym(RTLD_NEXT, name) relative to the object that CALLED
 * dlsym (it reads its own return address). A C wrapper would make every
 * RTLD_NEXT lookup relative to the shim and hand the caller the wrong
 * "next" definition, so this entry point never adds a frame on the way to
 * the real dlsym: it asks shim_dlsym_route (hooks/kernels.c) where to
 * go and tail-jumps there with the caller's arguments and return address
 * untouched. The route is the real dlsym for RTLD_NEXT and for every name
 * probe does not wrap, and shim_dlsym_wrap (a C function that calls the real
 * dlsym and wraps the CUDA driver launch entry points) for the few it does.
 *
 * Stack: at entry rsp = 8 mod 16; rdi and rsi are saved (16 bytes) and 8
 * more keep the call aligned (SysV ABI 3.2.2). Only rdi/rsi carry dlsym's
 * arguments; rax returns the target. */
    .text
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
#if defined(__CET__)
    endbr64
#endif
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call shim_dlsym_route@PLT
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size dlsym, .-dlsym

    .section .note.GNU-stack,"",@progbits
