/*
 * The pod sandbox's one process: it holds the pod's namespaces open for the
 * pod's containers and does nothing else. There is no registry to pull a
 * sandbox image from, so the local node's containerd pins this one
 * (devcluster/node.py).
 *
 * As PID 1 of its namespace it has no default signal dispositions, so it
 * handles them itself: SIGTERM and SIGINT end it at once (exit 0, so a
 * sandbox stops without waiting out a kill timeout), and SIGCHLD reaps any
 * orphan re-parented to it (a pod that shares its PID namespace).
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = stop;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    action.sa_handler = reap;
    action.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &action, NULL);
    for (;;) {
        pause();
    }
}
