/* The only file of the scratch test image: a static binary, so the image
 * runs when it is named directly, but has no /bin/sh for the prologue. */
#include <unistd.h>

int main(void) {
    static const char line[] = "hello from a scratch image\n";
    return write(1, line, sizeof line - 1) == (ssize_t)(sizeof line - 1) ? 0 : 1;
}
